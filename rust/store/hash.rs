//! In-process store: torch's `HashStore` on the one key-value engine ([`Db`]), with threads
//! blocking on its waiters through the stores' one blocking facade ([`facade`]).
//!
//! Nothing here decides semantics: the map, the queues, the wake-ups and torch's quirks (as a
//! [`Policy`]) are the engine's, shared with the TCP server, so the two cannot drift apart.
//! What this adds is torch's blocking API: a call that must wait registers a
//! [`Waiter`](super::db::Waiter) under the keys it still misses and parks its thread until a
//! write releases it, its deadline passes or (through `block_interruptibly`) Ctrl-C is seen. Only the writes that complete a caller's keys wake it (a world-64 `all_gather` with
//! one condition variable for the store woke all 64 callers on each of 64 writes). A woken
//! caller looks again, since a key may have been deleted meanwhile.
//!
//! `add` wakes waiters (torch's HashStore does not, so a waiter on a key created by `add`
//! sleeps until its timeout). `clone_store` returns a handle to the same map, as torch's
//! `clone()` returns the same store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::db::{Db, Policy};
use super::facade::{self, key_bytes, keys_bytes};
use super::{Blocking, Capabilities, Interrupt, Store, Unblocked, DEFAULT_TIMEOUT};
use crate::error::{Error, Result};

/// A thread-safe in-memory store; cheap to clone (clones share the map).
#[derive(Clone)]
pub struct HashStore {
    db: Db,
    timeout: Arc<Mutex<Duration>>,
}

impl Default for HashStore {
    fn default() -> Self {
        Self::new()
    }
}

fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl HashStore {
    /// An empty store with torch's default 300 s timeout.
    pub fn new() -> Self {
        HashStore {
            db: Db::with_policy(Policy::HASH_STORE),
            timeout: Arc::new(Mutex::new(DEFAULT_TIMEOUT)),
        }
    }
}

impl Store for HashStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            extended_api: true,
            in_memory: true,
            interruptible_waits: true,
            ..Capabilities::BASIC
        }
    }

    /// Interruptible at no cost: the check runs beside one registered wait.
    fn block_interruptibly(
        &self,
        call: Blocking<'_>,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Unblocked> {
        facade::block_interruptibly(&self.db, call, timeout, interrupted)
    }

    fn get_now(&self, key: &str) -> Option<Vec<u8>> {
        self.db.value_with(key.as_bytes(), <[u8]>::to_vec)
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.db.set(key_bytes(key), Bytes::copy_from_slice(value));
        Ok(())
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        if let Some(value) = self.get_now(key) {
            return Ok(value); // the common case, without allocating a key
        }
        let mut values = facade::values(&self.db, "get", &[key_bytes(key)], timeout, None)?;
        Ok(values.pop().expect("one key, one value"))
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        self.db.add(key.as_bytes(), amount)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let now = self.db.compare_set(
            key_bytes(key),
            Bytes::copy_from_slice(expected),
            Bytes::copy_from_slice(desired),
        );
        Ok(now.to_vec())
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        Ok(self.db.check(&keys_bytes(keys)))
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        facade::present(&self.db, "wait", &keys_bytes(keys), timeout, None)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.db.delete_key(key.as_bytes()) == 1)
    }

    fn num_keys(&self) -> Result<i64> {
        Ok(self.db.num_keys())
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.clone()))
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.db.append(key_bytes(key), value);
        Ok(())
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        facade::values(
            &self.db,
            "multi_get",
            &keys_bytes(keys),
            self.timeout(),
            None,
        )
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        super::same_length(keys, values)?;
        let pairs = keys
            .iter()
            .zip(values)
            .map(|(k, v)| (key_bytes(k), Bytes::copy_from_slice(v)))
            .collect();
        self.db.multi_set(pairs);
        Ok(())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.db
            .queue_push(key_bytes(key), Bytes::copy_from_slice(value));
        Ok(())
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        if !block {
            let (_, front) = self.db.queue_pop(key.as_bytes());
            return front.map(|v| v.to_vec()).ok_or(Error::QueueEmpty);
        }
        self.queue_pop_timeout(key, self.timeout())
    }

    /// Waits on the queue itself (a value under the same key does not end the wait).
    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        facade::pop(&self.db, &key_bytes(key), timeout, None)
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        Ok(self.db.queue_len(key.as_bytes()))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        Ok(self.db.list_keys().iter().map(|k| text(k)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    use crate::store::Deadline;

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
        assert_eq!(
            store.db.pending_waits(),
            0,
            "released waiters leave no registration"
        );
    }

    #[test]
    fn a_waiter_whose_key_is_deleted_again_keeps_waiting_until_it_reappears() {
        let store = HashStore::new();
        let key = [Bytes::from_static(b"k")];
        let mut waiter = store.db.values_or_wait(&key).expect_err("k is missing");
        store.set("k", b"1").unwrap();
        store.delete_key("k").unwrap();
        assert!(waiter.block_until(Deadline::after(Duration::from_secs(10))));
        assert!(
            store.db.values_or_wait(&key).is_err(),
            "woken, but the key is gone: the caller waits again"
        );
        let writer = store.clone();
        let handle = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            writer.set("k", b"2").unwrap();
        });
        assert_eq!(
            store.get_timeout("k", Duration::from_secs(10)).unwrap(),
            b"2"
        );
        handle.join().unwrap();
    }

    #[test]
    fn a_hash_store_is_in_memory_under_a_prefix_too_and_a_file_store_is_not() {
        let hash: Arc<dyn Store> = Arc::new(HashStore::new());
        assert!(hash.capabilities().in_memory);
        assert!(
            crate::store::prefix::PrefixStore::new("p", hash.clone())
                .capabilities()
                .in_memory
        );
        let dir = tempfile::tempdir().unwrap();
        let file = crate::store::file::FileStore::new(dir.path().join("f"), 1).unwrap();
        assert!(!file.capabilities().in_memory);
        assert_eq!(file.get_now("k"), None);
        let prefixed = crate::store::prefix::PrefixStore::new("p", hash.clone());
        prefixed.set("k", b"v").unwrap();
        assert_eq!(prefixed.get_now("k"), Some(b"v".to_vec()));
        assert_eq!(hash.get_now("p/k"), Some(b"v".to_vec()));
        assert_eq!(hash.get_now("k"), None);
    }

    #[test]
    fn add_on_an_empty_value_counts_from_zero_as_torchs_hash_store() {
        let store = HashStore::new();
        store.set("k", b"").unwrap();
        assert_eq!(store.add("k", 1).unwrap(), 1);
    }
}
