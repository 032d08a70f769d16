//! THE key-value engine: the map, the queues and the registry of waiters, shared by the TCP
//! server (every connection of `ferrodist-store` or of a master) and by [`super::HashStore`].
//! One engine means one set of semantics; where torch's HashStore and torch's TCP servers
//! disagree, the difference is a [`Policy`] flag, not a second implementation.
//!
//! One `std::sync::RwLock` guards it all. Every operation under the lock is a few map lookups
//! and never awaits, so a blocking lock is cheaper than an async one and cannot be held across
//! an `.await` by mistake (mini-redis makes the same argument for its `Db`). Reads share it, and
//! a waiting writer goes before new readers, so a small SET waits for at most one slice of a
//! large MULTI_GET: with a mutex, the reader took the lock back between its slices before the
//! waiting writer woke, and a small client's p99 rose by 38-82 ms.
//!
//! A wait that cannot be answered at once becomes a [`Waiter`], registered in the [`Registry`]
//! under each missing key. An async task polls it ([`Waiter::poll_released`], the server's
//! connections); a thread blocks on it ([`Waiter::block_until`], HashStore): both are woken by
//! the same registry through a `Waker`. Waking a key releases every waiter whose last missing
//! key it was. A waiter that is cancelled (CANCEL_WAIT) or dropped (the connection closed, the
//! call returned) can never wake or be woken again, so unlike torch's libuv server a stale
//! registration cannot release an unrelated later wait.
//!
//! Work under the lock is bounded per request for the server: a WAIT on more than
//! [`WAIT_SLICE`] keys ([`Db::wait_sliced`]) is checked a slice at a time by the connection's
//! own task, between which the lock is free and the task yields, and it is registered under one
//! missing key at a time. Registering 100,000 missing keys at once held the lock for 115-170 ms
//! (and cancelling them as long) on a loaded 2-core machine, which stalled every other client.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{ready, Context, Poll, Wake, Waker};
use std::thread::Thread;

use bytes::Bytes;

use super::entries::Entries;
use super::parse_counter;
use super::waiters::Registry;
use super::Deadline;
use crate::error::Result;

/// Where torch's two families of stores behave differently, what this engine does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// `add` on a key whose value is empty counts from 0, as torch's HashStore does (its TCP
    /// servers refuse it and close the connection).
    pub empty_value_counts_as_zero: bool,
}

impl Policy {
    /// torch's HashStore.
    pub const HASH_STORE: Policy = Policy {
        empty_value_counts_as_zero: true,
    };
    /// torch's TCP servers (libuv and legacy).
    pub const TCP_SERVER: Policy = Policy {
        empty_value_counts_as_zero: false,
    };
}

#[derive(Default)]
struct State {
    /// Kept behind the lock rather than in [`Db`], so a `Db` stays one pointer (every server
    /// connection's task holds one).
    policy: Policy,
    values: Entries,
    queues: HashMap<Bytes, VecDeque<Bytes>>,
    waits: Registry,
}

impl State {
    fn present(&self, key: &[u8]) -> bool {
        self.values.contains(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    fn register(&mut self, missing: Vec<Bytes>, db: &Db) -> Waiter {
        let id = self.waits.register(missing);
        Waiter {
            id,
            db: db.clone(),
            sliced: None,
        }
    }
}

/// Keys a WAIT checks under one hold of the lock (see [`Db::wait_sliced`]).
pub const WAIT_SLICE: usize = 1024;

/// [`Waiter::id`] while a sliced wait holds no registration.
const UNREGISTERED: usize = usize::MAX;

/// A pending wait. Await [`Waiter::released`]; dropping it cancels the registration.
pub struct Waiter {
    /// Its registration in the registry, or [`UNREGISTERED`].
    id: usize,
    db: Db,
    /// A wait on many keys: the keys, and how many of them are known present.
    sliced: Option<Box<(Vec<Bytes>, usize)>>,
}

impl Waiter {
    /// Resolves once every key the wait needed is present.
    pub async fn released(&mut self) {
        std::future::poll_fn(|cx| self.poll_released(cx)).await
    }

    /// Ready once every key the wait needed is present; otherwise `cx` is woken when they are
    /// (or, for a sliced wait with keys left to check, at once: the caller yields, then goes on).
    pub fn poll_released(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.db.lock();
        let Some(sliced) = self.sliced.as_mut() else {
            return state.waits.poll_released(self.id, cx);
        };
        let (keys, present) = &mut **sliced;
        if self.id != UNREGISTERED {
            ready!(state.waits.poll_released(self.id, cx));
            state.waits.remove(self.id);
            self.id = UNREGISTERED;
            *present += 1; // the key it waited on has arrived, whatever happened to it since
        }
        let end = keys.len().min(*present + WAIT_SLICE);
        while *present < end {
            let key = &keys[*present];
            if !state.present(key) {
                self.id = state.waits.register(vec![key.clone()]);
                return state.waits.poll_released(self.id, cx);
            }
            *present += 1;
        }
        if *present == keys.len() {
            return Poll::Ready(());
        }
        drop(state);
        crate::runtime::yield_turn(cx)
    }

    /// Blocks the calling thread until released (true) or `deadline` passes (false).
    pub fn block_until(&mut self, deadline: Deadline) -> bool {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            // Registering the waker and checking happen under the store's lock, and an unpark
            // that comes before the park makes it return at once: no wake-up is lost.
            if self.poll_released(&mut cx).is_ready() {
                return true;
            }
            match deadline.remaining() {
                None => std::thread::park(),
                Some(left) if left.is_zero() => return false,
                Some(left) => std::thread::park_timeout(left),
            }
        }
    }

    /// True once released (without registering to be woken; not for sliced waits).
    #[cfg(test)]
    fn is_released(&self) -> bool {
        self.db.lock().waits.is_released(self.id)
    }
}

/// Wakes a thread parked in [`Waiter::block_until`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.id != UNREGISTERED {
            self.db.lock().waits.remove(self.id);
        }
    }
}

/// The shared state of one store; cheap to clone (clones share it).
#[derive(Clone)]
pub struct Db {
    state: Arc<RwLock<State>>,
}

impl Default for Db {
    fn default() -> Db {
        Db::new()
    }
}

impl Db {
    /// An empty store with torch's TCP servers' policy.
    pub fn new() -> Db {
        Db::with_policy(Policy::TCP_SERVER)
    }

    /// An empty store with `policy`.
    pub fn with_policy(policy: Policy) -> Db {
        Db {
            state: Arc::new(RwLock::new(State {
                policy,
                ..State::default()
            })),
        }
    }

    fn lock(&self) -> RwLockWriteGuard<'_, State> {
        // Every update is a single map operation: a panic cannot leave it half-done.
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// SET: stores and wakes waiters on the key.
    pub fn set(&self, key: Bytes, value: Bytes) {
        let mut state = self.lock();
        state.waits.wake(&key);
        state.values.insert(&key, value);
    }

    /// COMPARE_SET with torch's four cases. Wakes waiters only when the key was written (torch's
    /// libuv server wakes them in every case, which makes a stock client's GET return empty).
    pub fn compare_set(&self, key: Bytes, expected: Bytes, desired: Bytes) -> Bytes {
        let mut state = self.lock();
        let write = match state.values.value(&key) {
            None => expected.is_empty(),
            Some(current) => *current == *expected,
        };
        if write {
            state.waits.wake(&key);
            state.values.insert(&key, desired.clone());
            return desired;
        }
        state.values.get(&key).unwrap_or(expected)
    }

    /// `f` of the value of `key`, if it has one, read in place under the lock (no copy of its
    /// own).
    pub fn value_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.read().values.value(key).map(f)
    }

    /// GET: the value, empty when missing (torch's libuv behaviour).
    pub fn get(&self, key: &[u8]) -> Bytes {
        self.read().values.get(key).unwrap_or_default()
    }

    /// ADD: a missing key counts as 0; a value that is not an integer is an error and nothing
    /// changes. The sum wraps on overflow, as torch's does.
    ///
    /// The counter's digits are rewritten in place while their length holds.
    pub fn add(&self, key: &[u8], delta: i64) -> Result<i64> {
        let mut state = self.lock();
        let empty_is_zero = state.policy.empty_value_counts_as_zero;
        let next = state.values.update_counter(key, |value| {
            let current = match value {
                None => 0,
                Some(value) if value.is_empty() && empty_is_zero => 0,
                Some(value) => parse_counter(&String::from_utf8_lossy(key), value)?,
            };
            Ok::<_, crate::error::Error>(current.wrapping_add(delta))
        })?;
        state.waits.wake(key);
        Ok(next)
    }

    /// CHECK: every key has a value or names a non-empty queue.
    pub fn check(&self, keys: &[Bytes]) -> bool {
        let state = self.read();
        keys.iter().all(|k| state.present(k))
    }

    /// WAIT: `None` when every key is present now, else a registered [`Waiter`].
    pub fn wait(&self, mut keys: Vec<Bytes>) -> Option<Waiter> {
        let mut state = self.lock();
        keys.retain(|k| !state.present(k));
        if keys.len() > 1 {
            let mut seen = HashSet::new();
            keys.retain(|k| seen.insert(k.clone()));
        }
        (!keys.is_empty()).then(|| state.register(keys, self))
    }

    /// The server's WAIT: [`Db::wait`] for up to [`WAIT_SLICE`] keys; for more, a [`Waiter`]
    /// that checks them a slice at a time as it is polled and waits on one missing key at a
    /// time, so no request holds the lock for more than a slice. A key counts as present when
    /// its turn comes (or when it arrives while waited on), not when the WAIT was read: one
    /// deleted before its turn is waited for again.
    pub fn wait_sliced(&self, keys: Vec<Bytes>) -> Option<Waiter> {
        if keys.len() <= WAIT_SLICE {
            return self.wait(keys);
        }
        Some(Waiter {
            id: UNREGISTERED,
            db: self.clone(),
            sliced: Some(Box::new((keys, 0))),
        })
    }

    /// A wait for every key in `keys` to hold a value (a non-empty queue does not count, unlike
    /// [`Db::wait`]): the values when they all do now, else a registered [`Waiter`] released
    /// by the next write to each key still missing (callers check again once released: a key
    /// may have been deleted, or only pushed to as a queue, meanwhile).
    pub fn values_or_wait(&self, keys: &[Bytes]) -> std::result::Result<Vec<Bytes>, Waiter> {
        let mut state = self.lock();
        let mut missing: Vec<Bytes> = Vec::new();
        let mut seen = HashSet::new();
        for key in keys {
            if !state.values.contains(key) && seen.insert(key.clone()) {
                missing.push(key.clone());
            }
        }
        if missing.is_empty() {
            return Ok(keys
                .iter()
                .map(|k| state.values.get(k).unwrap_or_default())
                .collect());
        }
        Err(state.register(missing, self))
    }

    /// The keys of `keys` that are not present (no value and no non-empty queue).
    pub fn missing(&self, keys: &[Bytes]) -> Vec<Bytes> {
        let state = self.read();
        keys.iter().filter(|k| !state.present(k)).cloned().collect()
    }

    /// GETNUMKEYS: size of the key-value map (queues excluded, internal keys included).
    pub fn num_keys(&self) -> i64 {
        self.read().values.len() as i64
    }

    /// DELETE_KEY: 1 if removed, else 0. Wakes nobody.
    pub fn delete_key(&self, key: &[u8]) -> i64 {
        i64::from(self.lock().values.remove(key))
    }

    /// APPEND: creates or extends the value, and wakes waiters.
    pub fn append(&self, key: Bytes, data: &[u8]) {
        let mut state = self.lock();
        state.waits.wake(&key);
        state.values.append(&key, data);
    }

    /// MULTI_GET: one value per key, empty for a missing one. Read [`WAIT_SLICE`] keys per
    /// hold of the lock, so other clients' requests get in between: a MULTI_GET of more keys
    /// than that is not one snapshot (a write may land between two slices).
    pub fn multi_get(&self, keys: &[Bytes]) -> Vec<Bytes> {
        let mut values = Vec::with_capacity(keys.len());
        for slice in keys.chunks(WAIT_SLICE) {
            self.read().values.get_many(slice, &mut values);
        }
        values
    }

    /// MULTI_SET: sets in order, waking each key's waiters.
    pub fn multi_set(&self, pairs: Vec<(Bytes, Bytes)>) {
        let mut state = self.lock();
        for (key, value) in pairs {
            state.waits.wake(&key);
            state.values.insert(&key, value);
        }
    }

    /// QUEUE_PUSH: appends and releases one waiter on the queue.
    pub fn queue_push(&self, key: Bytes, value: Bytes) {
        let mut state = self.lock();
        state
            .queues
            .entry(key.clone())
            .or_default()
            .push_back(value);
        state.waits.wake_one(&key);
    }

    /// QUEUE_POP: the length before the pop, and the front element when there was one.
    pub fn queue_pop(&self, key: &[u8]) -> (i64, Option<Bytes>) {
        let mut state = self.lock();
        match state.queues.get_mut(key) {
            Some(queue) if !queue.is_empty() => {
                let len = queue.len() as i64;
                let front = queue.pop_front();
                if queue.is_empty() {
                    state.queues.remove(key);
                }
                (len, front)
            }
            _ => (0, None),
        }
    }

    /// The front of queue `key`, or a [`Waiter`] released by the next push to it (whatever
    /// else the key holds): a blocking pop for threads.
    pub fn queue_pop_or_wait(&self, key: &Bytes) -> std::result::Result<Bytes, Waiter> {
        let mut state = self.lock();
        if let Some(queue) = state.queues.get_mut(key) {
            if let Some(front) = queue.pop_front() {
                if queue.is_empty() {
                    state.queues.remove(key);
                }
                return Ok(front);
            }
        }
        Err(state.register(vec![key.clone()], self))
    }

    /// QUEUE_LEN: 0 for a queue that does not exist.
    pub fn queue_len(&self, key: &[u8]) -> i64 {
        self.read().queues.get(key).map_or(0, |q| q.len() as i64)
    }

    /// LIST_KEYS: every key of the map, internal ones included.
    pub fn list_keys(&self) -> Vec<Bytes> {
        self.read()
            .values
            .keys()
            .map(Bytes::copy_from_slice)
            .collect()
    }

    /// The keys `keep` accepts, copied under one read lock: a reader that wants a few keys
    /// (the flight recorder's live view) pays no copy of every other key, as [`Db::list_keys`]
    /// would make it.
    pub fn keys_where(&self, mut keep: impl FnMut(&[u8]) -> bool) -> Vec<Bytes> {
        self.read()
            .values
            .keys()
            .filter(|k| keep(k))
            .map(Bytes::copy_from_slice)
            .collect()
    }

    /// BARRIER: counts an arrival; `None` when this arrival releases the barrier (every earlier
    /// arrival is woken), else a [`Waiter`] released by the last one.
    pub fn barrier(&self, key: Bytes, world_size: i64) -> Result<Option<Waiter>> {
        let mut state = self.lock();
        let current = match state.values.value(&key) {
            None => 0,
            Some(v) => parse_counter(&String::from_utf8_lossy(&key), v)?,
        };
        let arrived = current.wrapping_add(1);
        state
            .values
            .insert_slice(&key, arrived.to_string().as_bytes());
        if arrived >= world_size {
            state.waits.wake(&key);
            return Ok(None);
        }
        Ok(Some(state.register(vec![key], self)))
    }

    /// The integer under `key` once it reaches `target`, or a [`Waiter`] released by the next
    /// change of `key`. Lets the process hosting the server count workers without polling.
    pub fn counter_at_least(&self, key: &Bytes, target: i64) -> std::result::Result<i64, Waiter> {
        let mut state = self.lock();
        let now = state
            .values
            .value(key)
            .and_then(|v| parse_counter("", v).ok())
            .unwrap_or(0);
        if now >= target {
            return Ok(now);
        }
        Err(state.register(vec![key.clone()], self))
    }

    /// Number of registered waits (for tests and metrics).
    pub fn pending_waits(&self) -> usize {
        self.lock().waits.pending_count()
    }

    /// Bytes of every key, value and queued item (for metrics). Summed on demand, O(keys):
    /// a scrape every few seconds costs less than a counter kept on every write.
    pub fn stored_bytes(&self) -> u64 {
        let state = self.read();
        let values: usize = state.values.iter().map(|(k, v)| k.len() + v.len()).sum();
        let queues: usize = state
            .queues
            .iter()
            .map(|(k, q)| k.len() + q.iter().map(Bytes::len).sum::<usize>())
            .sum();
        (values + queues) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// The fault hunt's append run: 4,096 appends of 4 KiB cost 25 s of server time when each
    /// copied the whole value. In place they are linear; this run (20,000 x 4 KiB, 80 MiB)
    /// would copy 800 GiB the old way.
    #[test]
    fn a_run_of_appends_grows_the_value_in_place() {
        let db = Db::new();
        let chunk = vec![7u8; 4096];
        let started = std::time::Instant::now();
        for _ in 0..20_000 {
            db.append(b("log"), &chunk);
        }
        let took = started.elapsed();
        assert_eq!(db.get(b"log").len(), 20_000 * 4096);
        assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
        let held = db.get(b"log"); // a reply still holding the value: the next append copies
        db.append(b("log"), b"!");
        assert_eq!(held.len(), 20_000 * 4096);
        assert_eq!(db.get(b"log").last(), Some(&b'!'));
    }

    #[tokio::test]
    async fn a_wait_on_two_keys_is_released_by_the_second_set_only() {
        let db = Db::new();
        let mut waiter = db.wait(vec![b("a"), b("b"), b("a")]).expect("pending");
        db.set(b("a"), b("1"));
        assert!(futures_poll(&mut waiter).is_none());
        db.set(b("b"), b("2"));
        waiter.released().await;
        assert_eq!(db.pending_waits(), 0);
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_registration() {
        let db = Db::new();
        let waiter = db.wait(vec![b("x")]).expect("pending");
        drop(waiter);
        assert_eq!(db.pending_waits(), 0);
        db.set(b("x"), b("1"));
        assert!(db.wait(vec![b("x")]).is_none());
    }

    #[tokio::test]
    async fn one_push_releases_one_queue_waiter() {
        let db = Db::new();
        let mut first = db.wait(vec![b("q")]).expect("pending");
        let mut second = db.wait(vec![b("q")]).expect("pending");
        db.queue_push(b("q"), b("e"));
        first.released().await;
        assert!(futures_poll(&mut second).is_none());
        assert_eq!(db.queue_pop(b"q"), (1, Some(b("e"))));
        db.queue_push(b("q"), b("f"));
        second.released().await;
    }

    #[tokio::test]
    async fn compare_set_that_changes_nothing_wakes_nobody() {
        let db = Db::new();
        let mut waiter = db.wait(vec![b("k")]).expect("pending");
        assert_eq!(db.compare_set(b("k"), b("x"), b("y")), b("x"));
        assert!(futures_poll(&mut waiter).is_none());
        assert_eq!(db.compare_set(b("k"), b(""), b("y")), b("y"));
        waiter.released().await;
    }

    #[tokio::test]
    async fn barrier_releases_all_on_the_last_arrival_and_keeps_its_count() {
        let db = Db::new();
        let mut first = db.barrier(b("bar"), 2).unwrap().expect("pending");
        assert!(db.barrier(b("bar"), 2).unwrap().is_none());
        first.released().await;
        assert_eq!(db.get(b"bar"), b("2"));
        assert!(db.barrier(b("bar"), 2).unwrap().is_none());
    }

    #[test]
    fn add_follows_torch_on_bad_values_and_overflow() {
        let db = Db::new();
        db.set(b("k"), b("12abc"));
        assert_eq!(db.add(b"k", 1).unwrap(), 13);
        db.set(b("bad"), b("abc"));
        assert!(db.add(b"bad", 1).is_err());
        assert_eq!(db.get(b"bad"), b("abc"));
        db.set(b("max"), Bytes::from(i64::MAX.to_string()));
        assert_eq!(db.add(b"max", 1).unwrap(), i64::MIN);
    }

    #[test]
    fn a_released_waiters_slot_is_reused_only_after_it_is_dropped() {
        let db = Db::new();
        let first = db.wait(vec![b("k1")]).expect("pending");
        db.set(b("k1"), b("v"));
        let second = db.wait(vec![b("k2")]).expect("pending");
        assert!(first.is_released() && !second.is_released());
        drop(first);
        let third = db.wait(vec![b("k3")]).expect("pending");
        db.set(b("k2"), b("v"));
        assert!(second.is_released() && !third.is_released());
        assert_eq!(db.pending_waits(), 1);
        drop((second, third));
        assert_eq!(db.pending_waits(), 0);
    }

    #[test]
    fn one_set_releases_every_waiter_on_the_key() {
        let db = Db::new();
        let waiters: Vec<Waiter> = (0..1000)
            .map(|_| db.wait(vec![b("go")]).expect("pending"))
            .collect();
        assert_eq!(db.pending_waits(), 1000);
        db.set(b("go"), b("1"));
        assert!(waiters.iter().all(Waiter::is_released));
        assert_eq!(db.pending_waits(), 0);
    }

    #[test]
    fn a_sliced_wait_checks_every_key_and_waits_on_each_missing_one() {
        let db = Db::new();
        let keys: Vec<Bytes> = (0..3 * WAIT_SLICE).map(|i| b(&format!("k{i}"))).collect();
        for key in &keys[..2 * WAIT_SLICE] {
            db.set(key.clone(), b("v"));
        }
        let mut waiter = db.wait_sliced(keys.clone()).expect("a sliced waiter");
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        for _ in 0..2 {
            assert!(waiter.poll_released(&mut cx).is_pending()); // a slice checked, then yields
            assert_eq!(db.pending_waits(), 0);
        }
        assert!(waiter.poll_released(&mut cx).is_pending());
        assert_eq!(db.pending_waits(), 1, "waits on the first missing key");
        for key in &keys[2 * WAIT_SLICE..3 * WAIT_SLICE - 1] {
            db.set(key.clone(), b("v"));
        }
        while waiter.poll_released(&mut cx).is_pending() {
            assert!(db.pending_waits() <= 1);
            if db.pending_waits() == 1 && db.check(&keys[..3 * WAIT_SLICE - 1]) {
                db.set(keys[3 * WAIT_SLICE - 1].clone(), b("v"));
            }
        }
        drop(waiter);
        assert_eq!(db.pending_waits(), 0);
        assert!(
            db.wait_sliced(vec![b("x"); 2]).is_some(),
            "few keys: the plain wait"
        );
    }

    #[test]
    fn dropping_a_sliced_wait_leaves_no_registration() {
        let db = Db::new();
        let keys: Vec<Bytes> = (0..2 * WAIT_SLICE).map(|i| b(&format!("m{i}"))).collect();
        let mut waiter = db.wait_sliced(keys).expect("pending");
        let mut cx = Context::from_waker(Waker::noop());
        assert!(waiter.poll_released(&mut cx).is_pending());
        assert_eq!(db.pending_waits(), 1);
        drop(waiter);
        assert_eq!(db.pending_waits(), 0);
    }

    /// Polls a waiter once without blocking: `Some` iff it is released.
    fn futures_poll(waiter: &mut Waiter) -> Option<()> {
        waiter.is_released().then_some(())
    }
}
