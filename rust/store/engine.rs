//! The storage engine interface: torch's TCP store operations, waits and queues on raw keys,
//! answered now or later.
//!
//! Two engines implement it: the in-memory [`Db`](super::db::Db) and etcd
//! ([`EtcdEngine`](super::etcd::EtcdEngine)). The TCP server has one dispatcher from the wire
//! to this interface (`tcp/server/dispatch.rs`), whichever engine holds the keys.
//!
//! The shape follows what the two engines are like. The in-memory engine answers every
//! operation at once under its lock, and a server keeps tens of thousands of connections over
//! it: its [`Engine::Later`] is uninhabited ([`Never`]), so a connection holds no slot for an
//! operation in flight and no operation allocates. etcd answers after a round trip: its
//! operations are boxed futures that a connection polls while the others go on. A wait is a
//! [`Engine::Waiter`] either way: a registration woken by writers, or a watch.
//!
//! Keys are the wire's (bytes, torch's `/` prefix included) and the answers are torch's TCP
//! servers': a GET of a missing key is empty (clients WAIT first), ADD on a value that is not
//! an integer is refused, a BARRIER counts arrivals on its key.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::error::Result;

/// An operation's result: now, or an operation in flight (`L`) that gives it.
pub enum Op<T, L> {
    /// Answered while called.
    Now(Result<T>),
    /// In flight: poll it.
    Later(L),
}

/// What engine `E`'s operation returning `T` gives.
pub type Call<E, T> = Op<T, <E as Engine>::Later<T>>;

/// Values read a window at a time, as the reader takes them (a long MULTI_GET): an unread reply
/// then holds no copy of every value it names.
pub trait ValueSource: Send {
    /// Appends the next window of values to `out`; false once every value was given.
    fn next_window(&mut self, out: &mut VecDeque<Bytes>) -> bool;
}

/// The values of a MULTI_GET.
pub enum Values {
    /// Every value, in key order.
    All(Vec<Bytes>),
    /// Values read as the reader takes them.
    Windows(Box<dyn ValueSource>),
}

/// An operation in flight on an engine that never has one: no value of it exists.
pub struct Never<T>(Infallible, PhantomData<fn() -> T>);

impl<T> Never<T> {
    /// Whatever the caller needs: this cannot be called (no `Never` exists).
    pub fn absurd<U>(&self) -> U {
        match self.0 {}
    }
}

impl<T> Future for Never<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.absurd()
    }
}

/// A boxed operation in flight (an engine over the network).
pub type Boxed<T> = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// A key-value engine with torch's TCP store semantics. Cheap to clone: every connection of a
/// server holds one.
pub trait Engine: Clone + Send + Sync + 'static {
    /// Whether the state outlives the server process (a restarted server serves every key).
    const DURABLE: bool;
    /// A pending WAIT or BARRIER.
    type Waiter: Send + Unpin + 'static;
    /// An operation in flight.
    type Later<T: Send + 'static>: Future<Output = Result<T>> + Send + Unpin + 'static;

    /// `later`, then `then` on its result: one operation in flight.
    fn then<T: Send + 'static, U: Send + 'static>(
        later: Self::Later<T>,
        then: impl FnOnce(Result<T>) -> U + Send + 'static,
    ) -> Self::Later<U>;

    /// Ready once `waiter` is released (or failed).
    fn poll_released(waiter: &mut Self::Waiter, cx: &mut Context<'_>) -> Poll<Result<()>>;

    /// SET.
    fn set(&self, key: Bytes, value: Bytes) -> Call<Self, ()>;
    /// GET: the value, empty when the key is missing.
    fn get(&self, key: Bytes) -> Call<Self, Bytes>;
    /// ADD: the new value.
    fn add(&self, key: Bytes, delta: i64) -> Call<Self, i64>;
    /// COMPARE_SET: the value after the call.
    fn compare_set(&self, key: Bytes, expected: Bytes, desired: Bytes) -> Call<Self, Bytes>;
    /// CHECK: whether every key is present.
    fn check(&self, keys: Vec<Bytes>) -> Call<Self, bool>;
    /// WAIT: None when every key is present now, else the wait (which may also look first).
    fn wait(&self, keys: Vec<Bytes>) -> Option<Self::Waiter>;
    /// GETNUMKEYS.
    fn num_keys(&self) -> Call<Self, i64>;
    /// DELETE_KEY: how many keys were deleted (0 or 1).
    fn delete_key(&self, key: Bytes) -> Call<Self, i64>;
    /// APPEND.
    fn append(&self, key: Bytes, value: Bytes) -> Call<Self, ()>;
    /// MULTI_GET.
    fn multi_get(&self, keys: Vec<Bytes>) -> Call<Self, Values>;
    /// MULTI_SET (a key given twice keeps its last value).
    fn multi_set(&self, pairs: Vec<(Bytes, Bytes)>) -> Call<Self, ()>;
    /// QUEUE_PUSH.
    fn queue_push(&self, key: Bytes, value: Bytes) -> Call<Self, ()>;
    /// QUEUE_POP: the length before the pop, and the element (None when empty).
    fn queue_pop(&self, key: Bytes) -> Call<Self, (i64, Option<Bytes>)>;
    /// QUEUE_LEN.
    fn queue_len(&self, key: Bytes) -> Call<Self, i64>;
    /// LIST_KEYS.
    fn list_keys(&self) -> Call<Self, Vec<Bytes>>;
    /// BARRIER: counts an arrival on `key`; None once `world_size` arrived, else the wait.
    fn barrier(&self, key: Bytes, world_size: i64) -> Call<Self, Option<Self::Waiter>>;
}
