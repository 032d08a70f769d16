//! The in-memory [`Db`] as an [`Engine`]: every operation is answered at once, under its lock.
//!
//! Its operations in flight are [`Never`]: a server connection over it holds no slot for one
//! and no operation allocates. A long MULTI_GET is read a window at a time as the peer takes
//! it, since small values are copied out of the engine.

use std::collections::VecDeque;
use std::task::{Context, Poll};

use bytes::Bytes;

use super::db::{Db, Waiter};
use super::engine::{Call, Engine, Never, Op, ValueSource, Values};
use crate::error::Result;

/// Keys read per window of a streamed MULTI_GET: at most 1 MiB of copied small values.
pub const STREAM_KEYS: usize = 256;

/// Keys of a long MULTI_GET, read [`STREAM_KEYS`] at a time.
struct LazyMultiGet {
    db: Db,
    keys: std::vec::IntoIter<Bytes>,
}

impl ValueSource for LazyMultiGet {
    fn next_window(&mut self, out: &mut VecDeque<Bytes>) -> bool {
        let window: Vec<Bytes> = self.keys.by_ref().take(STREAM_KEYS).collect();
        out.extend(self.db.multi_get(&window));
        self.keys.len() > 0
    }
}

fn now<T>(value: T) -> Call<Db, T>
where
    T: Send + 'static,
{
    Op::Now(Ok(value))
}

impl Engine for Db {
    const DURABLE: bool = false;
    type Waiter = Waiter;
    type Later<T: Send + 'static> = Never<T>;

    fn then<T: Send + 'static, U: Send + 'static>(
        later: Never<T>,
        _then: impl FnOnce(Result<T>) -> U + Send + 'static,
    ) -> Never<U> {
        later.absurd()
    }

    fn poll_released(waiter: &mut Waiter, cx: &mut Context<'_>) -> Poll<Result<()>> {
        waiter.poll_released(cx).map(Ok)
    }

    fn set(&self, key: Bytes, value: Bytes) -> Call<Self, ()> {
        Db::set(self, key, value);
        now(())
    }

    fn get(&self, key: Bytes) -> Call<Self, Bytes> {
        now(Db::get(self, &key))
    }

    fn add(&self, key: Bytes, delta: i64) -> Call<Self, i64> {
        Op::Now(Db::add(self, &key, delta))
    }

    fn compare_set(&self, key: Bytes, expected: Bytes, desired: Bytes) -> Call<Self, Bytes> {
        now(Db::compare_set(self, key, expected, desired))
    }

    fn check(&self, keys: Vec<Bytes>) -> Call<Self, bool> {
        now(Db::check(self, &keys))
    }

    fn wait(&self, keys: Vec<Bytes>) -> Option<Waiter> {
        self.wait_sliced(keys)
    }

    fn num_keys(&self) -> Call<Self, i64> {
        now(Db::num_keys(self))
    }

    fn delete_key(&self, key: Bytes) -> Call<Self, i64> {
        now(Db::delete_key(self, &key))
    }

    fn append(&self, key: Bytes, value: Bytes) -> Call<Self, ()> {
        Db::append(self, key, &value);
        now(())
    }

    fn multi_get(&self, keys: Vec<Bytes>) -> Call<Self, Values> {
        if keys.len() <= STREAM_KEYS {
            return now(Values::All(Db::multi_get(self, &keys)));
        }
        let source = LazyMultiGet {
            db: self.clone(),
            keys: keys.into_iter(),
        };
        now(Values::Windows(Box::new(source)))
    }

    fn multi_set(&self, pairs: Vec<(Bytes, Bytes)>) -> Call<Self, ()> {
        Db::multi_set(self, pairs);
        now(())
    }

    fn queue_push(&self, key: Bytes, value: Bytes) -> Call<Self, ()> {
        Db::queue_push(self, key, value);
        now(())
    }

    fn queue_pop(&self, key: Bytes) -> Call<Self, (i64, Option<Bytes>)> {
        now(Db::queue_pop(self, &key))
    }

    fn queue_len(&self, key: Bytes) -> Call<Self, i64> {
        now(Db::queue_len(self, &key))
    }

    fn list_keys(&self) -> Call<Self, Vec<Bytes>> {
        now(Db::list_keys(self))
    }

    fn barrier(&self, key: Bytes, world_size: i64) -> Call<Self, Option<Waiter>> {
        Op::Now(Db::barrier(self, key, world_size))
    }
}
