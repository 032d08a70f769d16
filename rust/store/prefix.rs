//! PrefixStore: a namespace inside another store, as torch's `PrefixStore`.
//!
//! Every keyed operation maps `key` to `prefix + "/" + key` and forwards to the underlying store,
//! which can be any [`Store`]: ours, or a torch/Python store through the foreign-store adapter.
//! Nesting composes (`PrefixStore("a", PrefixStore("b", s))` writes `b/a/k` into `s`).
//!
//! Store-wide calls pass straight through, as torch does: `num_keys` counts every key of the
//! underlying store (other prefixes included), and `timeout`/`set_timeout` are the underlying
//! store's. `list_keys` keeps torch's quirk of matching on the bare prefix (so `p` also lists
//! `p2/x` as `/x`), because code written against torch sees that list.

use std::sync::Arc;
use std::time::Duration;

use super::{Blocking, Capabilities, Interrupt, Roll, Store, Unblocked};
use crate::error::{Error, Result};

/// A view of `inner` where every key lives under `prefix/`.
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// A view of `inner` under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    /// The prefix (without the joining `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store this one forwards to.
    pub fn underlying(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }

    fn keys(&self, keys: &[String]) -> Vec<String> {
        keys.iter().map(|k| self.key(k)).collect()
    }

    /// Restores the caller's key names in a timeout error from the underlying store.
    fn unprefixed(&self, err: Error) -> Error {
        match err {
            Error::Timeout { op, after, detail } => {
                let marker = format!("{}/", self.prefix);
                Error::Timeout {
                    op,
                    after,
                    detail: detail.replace(&marker, ""),
                }
            }
            other => other,
        }
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.inner
            .get(&self.key(key))
            .map_err(|e| self.unprefixed(e))
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner
            .get_timeout(&self.key(key), timeout)
            .map_err(|e| self.unprefixed(e))
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        self.inner.add(&self.key(key), amount)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(&self.key(key), expected, desired)
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        self.inner.check(&self.keys(keys))
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.inner
            .wait(&self.keys(keys), timeout)
            .map_err(|e| self.unprefixed(e))
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.inner.delete_key(&self.key(key))
    }

    fn num_keys(&self) -> Result<i64> {
        self.inner.num_keys()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(PrefixStore::new(
            self.prefix.clone(),
            self.inner.clone_store()?,
        )))
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn block_interruptibly(
        &self,
        call: Blocking<'_>,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Unblocked> {
        let (key, keys): (String, Vec<String>);
        let prefixed = match call {
            Blocking::Get(k) => {
                key = self.key(k);
                Blocking::Get(&key)
            }
            Blocking::QueuePop(k) => {
                key = self.key(k);
                Blocking::QueuePop(&key)
            }
            Blocking::Wait(ks) => {
                keys = self.keys(ks);
                Blocking::Wait(&keys)
            }
            Blocking::MultiGet(ks) => {
                keys = self.keys(ks);
                Blocking::MultiGet(&keys)
            }
        };
        self.inner
            .block_interruptibly(prefixed, timeout, interrupted)
            .map_err(|e| self.unprefixed(e))
    }

    fn get_now(&self, key: &str) -> Option<Vec<u8>> {
        self.inner.get_now(&self.key(key))
    }

    fn roll(&self) -> Option<&dyn Roll> {
        self.inner.roll().map(|_| self as &dyn Roll)
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.append(&self.key(key), value)
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        self.inner
            .multi_get(&self.keys(keys))
            .map_err(|e| self.unprefixed(e))
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        self.inner.multi_set(&self.keys(keys), values)
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.queue_push(&self.key(key), value)
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        self.inner
            .queue_pop(&self.key(key), block)
            .map_err(|e| self.unprefixed(e))
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner
            .queue_pop_timeout(&self.key(key), timeout)
            .map_err(|e| self.unprefixed(e))
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        self.inner.queue_len(&self.key(key))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        let skip = self.prefix.len() + 1;
        Ok(self
            .inner
            .list_keys()?
            .into_iter()
            .filter(|k| k.starts_with(&self.prefix))
            .map(|k| k.get(skip..).unwrap_or_default().to_owned())
            .collect())
    }
}

/// The inner store's rolls, under this store's prefix (offered only where the inner store has
/// rolls of its own: see [`Store::roll`]).
impl Roll for PrefixStore {
    fn enroll(&self, roll: &str, member: usize) -> Result<usize> {
        self.inner_roll()?.enroll(&self.key(roll), member)
    }

    fn enrolled(&self, roll: &str) -> Result<Vec<usize>> {
        self.inner_roll()?.enrolled(&self.key(roll))
    }
}

impl PrefixStore {
    fn inner_roll(&self) -> Result<&dyn Roll> {
        self.inner
            .roll()
            .ok_or_else(|| Error::NotImplemented("the prefixed store has no rolls".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;

    #[test]
    fn keys_live_under_the_prefix_and_nesting_composes() {
        let base = Arc::new(HashStore::new());
        let inner: Arc<dyn Store> = Arc::new(PrefixStore::new("b", base.clone()));
        let outer = PrefixStore::new("a", inner);
        outer.set("k", b"v").unwrap();
        assert_eq!(base.get("b/a/k").unwrap(), b"v");
        assert_eq!(outer.get("k").unwrap(), b"v");
        assert_eq!(outer.num_keys().unwrap(), 1);
        assert_eq!(outer.add("n", 2).unwrap(), 2);
        assert_eq!(base.get("b/a/n").unwrap(), b"2");
    }

    #[test]
    fn list_keys_keeps_torchs_bare_prefix_match() {
        let base = Arc::new(HashStore::new());
        base.set("p/x", b"1").unwrap();
        base.set("p2/y", b"1").unwrap();
        base.set("q/z", b"1").unwrap();
        let mut keys = PrefixStore::new("p", base).list_keys().unwrap();
        keys.sort();
        assert_eq!(keys, vec!["/y".to_string(), "x".to_string()]);
    }

    #[test]
    fn timeout_names_the_callers_keys() {
        let store = PrefixStore::new("pre", Arc::new(HashStore::new()));
        let err = store
            .wait(&["missing".into()], Some(Duration::from_millis(10)))
            .unwrap_err();
        assert!(err.to_string().contains("keys: {missing}"), "{err}");
    }
}
