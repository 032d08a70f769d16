//! In-process store: a map, a set of queues and one mutex; each blocked caller sleeps on its own
//! condition variable.
//!
//! Why not one condition variable for the store: every write then woke every blocked caller to
//! re-check its keys. A world-64 `all_gather` has 64 callers each waiting for 64 keys, so each
//! of the 64 writes woke all 64 (4096 wake-ups, most of the collective's time). Here a caller
//! registers under the keys it is still missing with a count of them; a write to a key counts
//! down its watchers and wakes only those whose count reaches zero. A woken caller re-checks its
//! condition (a key may have been deleted again) and registers anew if it still has to wait.
//!
//! Semantics follow torch's `HashStore`, with one deliberate fix: `add` wakes waiters too
//! (torch's does not, so a waiter on a key created by `add` sleeps until its timeout).
//! `clone_store` returns a handle to the same map, as torch's `clone()` returns the same store.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{parse_counter, Deadline, Store, DEFAULT_TIMEOUT};
use crate::error::{Error, Result};

#[derive(Default)]
struct State {
    values: HashMap<String, Vec<u8>>,
    queues: HashMap<String, VecDeque<Vec<u8>>>,
    /// Blocked callers by the keys they are still missing. Empty unless someone waits, so a
    /// write with nobody waiting pays one emptiness check.
    watchers: HashMap<String, Vec<Arc<Watcher>>>,
}

/// One blocked caller: how many of its keys are still unwritten, and where it sleeps.
struct Watcher {
    /// Decremented under the store's lock by each write to one of its keys.
    missing: AtomicUsize,
    wake: Condvar,
}

impl State {
    /// A key counts as present if it has a value or names a non-empty queue (torch's rule).
    fn present(&self, key: &str) -> bool {
        self.values.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }
}

struct Shared {
    state: Mutex<State>,
    timeout: Mutex<Duration>,
}

/// A thread-safe in-memory store; cheap to clone (clones share the map).
#[derive(Clone)]
pub struct HashStore {
    shared: Arc<Shared>,
}

impl Default for HashStore {
    fn default() -> Self {
        Self::new()
    }
}

impl HashStore {
    /// An empty store with torch's default 300 s timeout.
    pub fn new() -> Self {
        HashStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                timeout: Mutex::new(DEFAULT_TIMEOUT),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated (every update is a
        // single insert/remove), so a poisoned lock is safe to keep using.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until `ready(state)` holds or the deadline passes; returns the guard on success.
    /// `watch` names the keys whose writes can make `ready` true.
    fn wait_until<'a>(
        &'a self,
        mut guard: MutexGuard<'a, State>,
        deadline: Deadline,
        watch: &[&str],
        ready: impl Fn(&State) -> bool,
    ) -> std::result::Result<MutexGuard<'a, State>, MutexGuard<'a, State>> {
        while !ready(&guard) {
            let left = deadline.remaining();
            if left.is_some_and(|l| l.is_zero()) {
                return Err(guard);
            }
            let mut seen = HashSet::new();
            let distinct: Vec<&str> = watch.iter().copied().filter(|k| seen.insert(*k)).collect();
            let mut missing: Vec<&str> = distinct
                .iter()
                .copied()
                .filter(|k| !guard.present(k))
                .collect();
            if missing.is_empty() {
                // `ready` asks for more than presence (a value, not a queue): any write counts.
                missing = distinct;
            }
            let watcher = Arc::new(Watcher {
                missing: AtomicUsize::new(missing.len().max(1)),
                wake: Condvar::new(),
            });
            for key in &missing {
                let list = guard.watchers.entry((*key).to_owned()).or_default();
                list.push(Arc::clone(&watcher));
            }
            guard = match left {
                None => watcher.wake.wait(guard).unwrap_or_else(|p| p.into_inner()),
                Some(left) => {
                    watcher
                        .wake
                        .wait_timeout(guard, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
            for key in &missing {
                if let Some(list) = guard.watchers.get_mut(*key) {
                    list.retain(|w| !Arc::ptr_eq(w, &watcher));
                    if list.is_empty() {
                        guard.watchers.remove(*key);
                    }
                }
            }
        }
        Ok(guard)
    }

    /// Counts down the watchers of the written `keys`, wakes those with nothing left to wait
    /// for, and releases the lock.
    fn publish<'k>(
        &self,
        mut state: MutexGuard<'_, State>,
        keys: impl IntoIterator<Item = &'k str>,
    ) {
        if !state.watchers.is_empty() {
            for key in keys {
                for watcher in state.watchers.remove(key).unwrap_or_default() {
                    if watcher.missing.fetch_sub(1, Ordering::Relaxed) == 1 {
                        watcher.wake.notify_one();
                    }
                }
            }
        }
        drop(state);
    }

    fn wait_for_keys(&self, keys: &[String], timeout: Duration, op: &str) -> Result<()> {
        let guard = self.lock();
        let deadline = Deadline::after(timeout);
        let watch: Vec<&str> = keys.iter().map(String::as_str).collect();
        match self.wait_until(guard, deadline, &watch, |s| {
            keys.iter().all(|k| s.present(k))
        }) {
            Ok(_) => Ok(()),
            Err(state) => {
                let missing: Vec<String> =
                    keys.iter().filter(|k| !state.present(k)).cloned().collect();
                Err(Error::wait_timeout(op, timeout, &missing))
            }
        }
    }
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut state = self.lock();
        state.values.insert(key.to_owned(), value.to_vec());
        self.publish(state, [key]);
        Ok(())
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let guard = self.lock();
        if let Some(value) = guard.values.get(key) {
            return Ok(value.clone());
        }
        match self.wait_until(guard, Deadline::after(timeout), &[key], |s| {
            s.values.contains_key(key)
        }) {
            Ok(state) => Ok(state.values[key].clone()),
            Err(_) => Err(Error::wait_timeout("get", timeout, &[key.to_owned()])),
        }
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        let mut state = self.lock();
        let current = match state.values.get(key) {
            None => 0,
            Some(v) if v.is_empty() => 0,
            Some(v) => parse_counter(key, v)?,
        };
        let next = current.wrapping_add(amount);
        state
            .values
            .insert(key.to_owned(), next.to_string().into_bytes());
        self.publish(state, [key]);
        Ok(next)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let mut state = self.lock();
        let result = match state.values.get(key) {
            None if expected.is_empty() => {
                state.values.insert(key.to_owned(), desired.to_vec());
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(current) if current == expected => {
                state.values.insert(key.to_owned(), desired.to_vec());
                desired.to_vec()
            }
            Some(current) => current.clone(),
        };
        self.publish(state, [key]);
        Ok(result)
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        let state = self.lock();
        Ok(keys.iter().all(|k| state.present(k)))
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.wait_for_keys(keys, timeout.unwrap_or_else(|| self.timeout()), "wait")
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.lock().values.remove(key).is_some())
    }

    fn num_keys(&self) -> Result<i64> {
        Ok(self.lock().values.len() as i64)
    }

    fn timeout(&self) -> Duration {
        *self
            .shared
            .timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self
            .shared
            .timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.clone()))
    }

    fn has_extended_api(&self) -> bool {
        true
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut state = self.lock();
        state
            .values
            .entry(key.to_owned())
            .or_default()
            .extend_from_slice(value);
        self.publish(state, [key]);
        Ok(())
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        let guard = self.lock();
        let timeout = self.timeout();
        let watch: Vec<&str> = keys.iter().map(String::as_str).collect();
        match self.wait_until(guard, Deadline::after(timeout), &watch, |s| {
            keys.iter().all(|k| s.values.contains_key(k))
        }) {
            Ok(state) => Ok(keys.iter().map(|k| state.values[k].clone()).collect()),
            Err(state) => {
                let missing: Vec<String> = keys
                    .iter()
                    .filter(|k| !state.values.contains_key(*k))
                    .cloned()
                    .collect();
                Err(Error::wait_timeout("multi_get", timeout, &missing))
            }
        }
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        if keys.len() != values.len() {
            return Err(Error::InvalidArgument(format!(
                "multi_set: {} keys but {} values",
                keys.len(),
                values.len()
            )));
        }
        let mut state = self.lock();
        for (k, v) in keys.iter().zip(values) {
            state.values.insert(k.clone(), v.clone());
        }
        self.publish(state, keys.iter().map(String::as_str));
        Ok(())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut state = self.lock();
        state
            .queues
            .entry(key.to_owned())
            .or_default()
            .push_back(value.to_vec());
        self.publish(state, [key]);
        Ok(())
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        if block {
            self.wait_for_keys(&[key.to_owned()], self.timeout(), "queue_pop")?;
        }
        self.lock()
            .queues
            .get_mut(key)
            .and_then(VecDeque::pop_front)
            .ok_or(Error::QueueEmpty)
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        Ok(self.lock().queues.get(key).map_or(0, |q| q.len() as i64))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        Ok(self.lock().values.keys().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn wait_is_released_by_a_set_from_another_thread() {
        let store = HashStore::new();
        let writer = store.clone();
        let handle = thread::spawn(move || writer.set("k", b"v").unwrap());
        store
            .wait(&["k".into()], Some(Duration::from_secs(10)))
            .unwrap();
        handle.join().unwrap();
        assert_eq!(store.get("k").unwrap(), b"v");
    }

    #[test]
    fn wait_timeout_names_the_missing_keys() {
        let store = HashStore::new();
        store.set("here", b"1").unwrap();
        let err = store
            .wait(
                &["here".into(), "gone".into()],
                Some(Duration::from_millis(20)),
            )
            .unwrap_err();
        let text = err.to_string();
        assert!(err.is_timeout());
        assert!(text.contains("gone") && !text.contains("here"), "{text}");
    }

    #[test]
    fn compare_set_follows_torchs_four_cases() {
        let store = HashStore::new();
        assert_eq!(store.compare_set("k", b"x", b"y").unwrap(), b"x");
        assert_eq!(store.compare_set("k", b"", b"y").unwrap(), b"y");
        assert_eq!(store.compare_set("k", b"y", b"z").unwrap(), b"z");
        assert_eq!(store.compare_set("k", b"q", b"w").unwrap(), b"z");
    }

    #[test]
    fn queue_pop_on_empty_queue_is_queue_empty() {
        let store = HashStore::new();
        assert!(matches!(
            store.queue_pop("q", false),
            Err(Error::QueueEmpty)
        ));
        store.queue_push("q", b"a").unwrap();
        assert_eq!(store.queue_len("q").unwrap(), 1);
        assert!(store.check(&["q".into()]).unwrap());
        assert_eq!(store.queue_pop("q", true).unwrap(), b"a");
    }

    #[test]
    fn base_barrier_releases_all_members() {
        let store = HashStore::new();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let s = store.clone();
                thread::spawn(move || s.barrier("b", 4, Some(Duration::from_secs(10))))
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    }

    #[test]
    fn many_waiters_on_many_keys_are_each_released_once_all_their_keys_exist() {
        let store = HashStore::new();
        let keys: Vec<String> = (0..16).map(|r| format!("k/{r}")).collect();
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let (store, keys) = (store.clone(), keys.clone());
                thread::spawn(move || store.multi_get(&keys).unwrap())
            })
            .collect();
        for (r, key) in keys.iter().enumerate() {
            thread::sleep(Duration::from_millis(1));
            store.set(key, r.to_string().as_bytes()).unwrap();
        }
        let expected: Vec<Vec<u8>> = (0..16).map(|r| r.to_string().into_bytes()).collect();
        for waiter in waiters {
            assert_eq!(waiter.join().unwrap(), expected);
        }
        assert!(
            store.lock().watchers.is_empty(),
            "released waiters leave no registration"
        );
    }

    #[test]
    fn a_waiter_whose_key_is_deleted_again_keeps_waiting_until_it_reappears() {
        let store = HashStore::new();
        let writer = store.clone();
        let handle = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            let mut state = writer.lock();
            // a write to "k" that is gone again before the waiter can look (set, then delete,
            // under one lock): the waiter is counted down and woken but must wait on
            state.values.insert("k".into(), b"1".to_vec());
            state.values.remove("k");
            writer.publish(state, ["k"]);
            thread::sleep(Duration::from_millis(50));
            writer.set("k", b"2").unwrap();
        });
        assert_eq!(
            store.get_timeout("k", Duration::from_secs(10)).unwrap(),
            b"2"
        );
        handle.join().unwrap();
    }
}
