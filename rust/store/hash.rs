//! In-process store: a map, a set of queues, one mutex and one condition variable.
//!
//! Semantics follow torch's `HashStore`, with one deliberate fix: `add` wakes waiters too
//! (torch's does not, so a waiter on a key created by `add` sleeps until its timeout).
//! `clone_store` returns a handle to the same map, as torch's `clone()` returns the same store.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{parse_counter, Deadline, Store, DEFAULT_TIMEOUT};
use crate::error::{Error, Result};

#[derive(Default)]
struct State {
    values: HashMap<String, Vec<u8>>,
    queues: HashMap<String, VecDeque<Vec<u8>>>,
    /// Threads inside a condition-variable wait. Writers wake only when it is non-zero: a
    /// `notify_all` is a system call even with nobody waiting, and was most of a `set`.
    waiters: usize,
}

impl State {
    /// A key counts as present if it has a value or names a non-empty queue (torch's rule).
    fn present(&self, key: &str) -> bool {
        self.values.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
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
                changed: Condvar::new(),
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
    fn wait_until<'a>(
        &'a self,
        mut guard: MutexGuard<'a, State>,
        deadline: Deadline,
        ready: impl Fn(&State) -> bool,
    ) -> std::result::Result<MutexGuard<'a, State>, MutexGuard<'a, State>> {
        while !ready(&guard) {
            let left = deadline.remaining();
            if left.is_some_and(|l| l.is_zero()) {
                return Err(guard);
            }
            guard.waiters += 1;
            let changed = &self.shared.changed;
            guard = match left {
                None => changed.wait(guard).unwrap_or_else(|p| p.into_inner()),
                Some(left) => {
                    changed
                        .wait_timeout(guard, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
            guard.waiters -= 1;
        }
        Ok(guard)
    }

    /// Releases the lock and wakes waiters, if there are any, to look at the new state.
    fn publish(&self, state: MutexGuard<'_, State>) {
        let anyone_waiting = state.waiters > 0;
        drop(state);
        if anyone_waiting {
            self.shared.changed.notify_all();
        }
    }

    fn wait_for_keys(&self, keys: &[String], timeout: Duration, op: &str) -> Result<()> {
        let guard = self.lock();
        let deadline = Deadline::after(timeout);
        match self.wait_until(guard, deadline, |s| keys.iter().all(|k| s.present(k))) {
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
        self.publish(state);
        Ok(())
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let guard = self.lock();
        if let Some(value) = guard.values.get(key) {
            return Ok(value.clone());
        }
        match self.wait_until(guard, Deadline::after(timeout), |s| {
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
        self.publish(state);
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
        self.publish(state);
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
        self.publish(state);
        Ok(())
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        let guard = self.lock();
        let timeout = self.timeout();
        match self.wait_until(guard, Deadline::after(timeout), |s| {
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
        self.publish(state);
        Ok(())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut state = self.lock();
        state
            .queues
            .entry(key.to_owned())
            .or_default()
            .push_back(value.to_vec());
        // Wake everyone: a waiter on a plain key shares the condition variable.
        self.publish(state);
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
}
