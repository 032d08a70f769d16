//! Where a connection's requests are served from: the seam between the wire (`handler.rs`) and
//! the state.
//!
//! Two backends implement it. The in-memory engine ([`Db`]) answers every request at once,
//! under its lock, and its waits are registrations woken by writers: [`Served::Now`] always, and
//! its pending-request type is uninhabited, so a connection over it carries no slot for an
//! in-flight request and pays no allocation per request (the storm benchmarks keep tens of
//! thousands of connections). The etcd backend (`etcd_backend.rs`) answers from an etcd
//! cluster: each request is a future the connection polls ([`Served::Later`]) while the other
//! connections go on, and a WAIT is a watch.
//!
//! The handler keeps what is the protocol's (the handshake, PING, CANCEL_WAIT, the requests
//! held behind a pending wait); a backend sees only the data requests, one at a time per
//! connection and in the order they came.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use super::handler::Closed;
use super::outbox::ValueSource;
use crate::store::db::{Db, Waiter};
use crate::tcp::codec::{Opcode, Reply, Request, NOT_READY, READY, STOP_WAITING};

/// What a served request leaves for the connection to do.
pub enum Outcome<W> {
    /// Send this reply.
    Reply(Reply),
    /// Send nothing (SET, APPEND, MULTI_SET, QUEUE_PUSH have no reply in torch's protocol).
    Silent,
    /// A WAIT or BARRIER that is not released yet: STOP_WAITING goes out when `W` is.
    Waiting(W),
    /// A reply of values read as the peer takes them (a MULTI_GET of many keys).
    Stream(Box<dyn ValueSource>),
}

/// Keys of a long MULTI_GET on the in-memory engine, read [`STREAM_KEYS`] at a time.
struct LazyMultiGet {
    db: Db,
    keys: std::vec::IntoIter<Bytes>,
}

/// Keys read per window of a streamed MULTI_GET: at most 1 MiB of copied small values.
const STREAM_KEYS: usize = 256;

impl ValueSource for LazyMultiGet {
    fn next_window(&mut self, out: &mut VecDeque<Bytes>) -> bool {
        let window: Vec<Bytes> = self.keys.by_ref().take(STREAM_KEYS).collect();
        out.extend(self.db.multi_get(&window));
        self.keys.len() > 0
    }
}

/// A served request: its outcome, or the refusal that closes the connection.
pub type Answer<W> = Result<Outcome<W>, Closed>;

/// A request that was in flight, done: its answer, and what the metrics count it as.
pub struct Finished<W> {
    /// The answer.
    pub answer: Answer<W>,
    /// The request's opcode.
    pub opcode: Opcode,
    /// When serving it began.
    pub since: Instant,
}

/// A request's answer now, or a future of it.
pub enum Served<B: Backend> {
    /// Answered while serving it.
    Now(Answer<B::Waiter>),
    /// Still in flight: the connection polls it (and serves nothing else until it is ready).
    Later(B::Pending),
}

/// The state a server serves. Cheap to clone: every connection holds one.
pub trait Backend: Clone + Send + Sync + 'static {
    /// Whether the state outlives the server process (a restarted server serves every key):
    /// ferrodist's clients are told in the handshake, and then reconnect within their deadline.
    const DURABLE: bool;
    /// A pending WAIT or BARRIER.
    type Waiter: Send + Unpin + 'static;
    /// A request in flight.
    type Pending: Future<Output = Finished<Self::Waiter>> + Send + Unpin + 'static;

    /// Serves one data request (never VALIDATE, PING or CANCEL_WAIT: the handler answers those).
    fn serve(&self, request: Request) -> Served<Self>;

    /// Ready once `waiter` is released (or failed, which closes the connection).
    fn poll_released(waiter: &mut Self::Waiter, cx: &mut Context<'_>) -> Poll<Result<(), Closed>>;
}

/// The in-memory engine's pending request: there is none (it answers every request at once).
pub enum Never {}

impl Future for Never {
    type Output = Finished<Waiter>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        match *self {}
    }
}

fn refused(err: crate::error::Error) -> Closed {
    Closed::Refused(err.to_string())
}

impl Backend for Db {
    const DURABLE: bool = false;
    type Waiter = Waiter;
    type Pending = Never;

    fn serve(&self, request: Request) -> Served<Self> {
        let reply = match request {
            Request::Set { key, value } => {
                self.set(key, value);
                return Served::Now(Ok(Outcome::Silent));
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => Reply::Value(self.compare_set(key, expected, desired)),
            Request::Get { key } => Reply::Value(self.get(&key)),
            Request::Add { key, delta } => match self.add(&key, delta) {
                Ok(sum) => Reply::Int(sum),
                Err(err) => return Served::Now(Err(refused(err))),
            },
            Request::Check { keys } => {
                Reply::Byte(if self.check(&keys) { READY } else { NOT_READY })
            }
            Request::Wait { keys } => match self.wait_sliced(keys) {
                None => Reply::Byte(STOP_WAITING),
                Some(waiter) => return Served::Now(Ok(Outcome::Waiting(waiter))),
            },
            Request::GetNumKeys => Reply::Int(self.num_keys()),
            Request::DeleteKey { key } => Reply::Int(self.delete_key(&key)),
            Request::Append { key, value } => {
                self.append(key, &value);
                return Served::Now(Ok(Outcome::Silent));
            }
            Request::MultiGet { keys } if keys.len() > STREAM_KEYS => {
                // Small values are copied out of the engine: read them as the peer reads, or an
                // unread reply would hold a copy of every value it names.
                let source = LazyMultiGet {
                    db: self.clone(),
                    keys: keys.into_iter(),
                };
                return Served::Now(Ok(Outcome::Stream(Box::new(source))));
            }
            Request::MultiGet { keys } => Reply::Values(self.multi_get(&keys)),
            Request::MultiSet { pairs } => {
                self.multi_set(pairs);
                return Served::Now(Ok(Outcome::Silent));
            }
            Request::QueuePush { key, value } => {
                self.queue_push(key, value);
                return Served::Now(Ok(Outcome::Silent));
            }
            Request::QueuePop { key } => {
                let (len_before, value) = self.queue_pop(&key);
                Reply::Popped { len_before, value }
            }
            Request::QueueLen { key } => Reply::Int(self.queue_len(&key)),
            Request::ListKeys => Reply::Keys(self.list_keys()),
            Request::Barrier { key, world_size } => match self.barrier(key, world_size) {
                Ok(None) => Reply::Byte(STOP_WAITING),
                Ok(Some(waiter)) => return Served::Now(Ok(Outcome::Waiting(waiter))),
                Err(err) => return Served::Now(Err(refused(err))),
            },
            Request::Validate { .. } | Request::Ping { .. } | Request::CancelWait => {
                return Served::Now(Err(not_data(&request)))
            }
        };
        Served::Now(Ok(Outcome::Reply(reply)))
    }

    fn poll_released(waiter: &mut Waiter, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        waiter.poll_released(cx).map(Ok)
    }
}

/// A protocol request that reached a backend (a handler bug, not the client's).
pub fn not_data(request: &Request) -> Closed {
    Closed::Refused(format!(
        "{:?} is not served by the store backend",
        request.opcode()
    ))
}
