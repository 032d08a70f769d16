//! The calls that wait for keys, made the way the store's [`Capabilities`] allow: in slices that
//! check for an interruption (Ctrl-C in Python) where that is cheap, else as one call with all
//! the time left. The bindings, the collectives and the rendezvous call these functions; the
//! choice is made here, once.
//!
//! A store implements one method for all four ([`Store::block_interruptibly`], a [`Blocking`]
//! call in, an [`Unblocked`] result out); the default slices the plain call ([`sliced`]), and a
//! store whose wait is costly to start again (EtcdStore sets up a watch) keeps one going and
//! checks beside it.

use std::time::Duration;

use super::{sliced, Capabilities, Interrupt, Store};
use crate::error::{Error, Result};

/// One blocking call, for [`Store::block_interruptibly`].
#[derive(Debug, Clone, Copy)]
pub enum Blocking<'a> {
    /// `get` of one key.
    Get(&'a str),
    /// `wait` for every key.
    Wait(&'a [String]),
    /// `multi_get`, waiting for every key.
    MultiGet(&'a [String]),
    /// A blocking `queue_pop`.
    QueuePop(&'a str),
}

/// What a [`Blocking`] call gives back.
#[derive(Debug)]
pub enum Unblocked {
    /// The keys of a `Wait` are all there.
    Ready,
    /// The value of a `Get`, the element of a `QueuePop`.
    Value(Vec<u8>),
    /// The values of a `MultiGet`, in key order.
    Values(Vec<Vec<u8>>),
}

/// [`Store::block_interruptibly`]'s default: the plain call in slices of at most
/// [`super::INTERRUPT_POLL`] (see [`sliced`]). `MultiGet` first waits for its keys, then reads
/// them.
pub fn in_slices<S: Store + ?Sized>(
    store: &S,
    call: Blocking<'_>,
    timeout: Duration,
    interrupted: Interrupt<'_>,
) -> Result<Unblocked> {
    match call {
        Blocking::Get(key) => sliced(timeout, |slice| store.get_timeout(key, slice), interrupted)
            .map(Unblocked::Value),
        Blocking::Wait(keys) => sliced(timeout, |slice| store.wait(keys, Some(slice)), interrupted)
            .map(|()| Unblocked::Ready),
        Blocking::MultiGet(keys) => {
            sliced(timeout, |slice| store.wait(keys, Some(slice)), interrupted)?;
            store.multi_get(keys).map(Unblocked::Values)
        }
        Blocking::QueuePop(key) => sliced(
            timeout,
            |slice| store.queue_pop_timeout(key, slice),
            interrupted,
        )
        .map(Unblocked::Value),
    }
}

fn interruptible(store: &dyn Store) -> bool {
    let Capabilities {
        interruptible_waits,
        ..
    } = store.capabilities();
    interruptible_waits
}

impl Unblocked {
    fn mismatch(self, op: &str) -> Error {
        Error::Store(format!(
            "{op}: the store answered with {self:?}, not what {op} returns"
        ))
    }

    fn value(self, op: &str) -> Result<Vec<u8>> {
        match self {
            Unblocked::Value(value) => Ok(value),
            other => Err(other.mismatch(op)),
        }
    }

    fn values(self, op: &str) -> Result<Vec<Vec<u8>>> {
        match self {
            Unblocked::Values(values) => Ok(values),
            other => Err(other.mismatch(op)),
        }
    }

    fn ready(self, op: &str) -> Result<()> {
        match self {
            Unblocked::Ready => Ok(()),
            other => Err(other.mismatch(op)),
        }
    }
}

/// The value of `key`, waiting up to `timeout` (zero: forever) for it.
pub fn get(
    store: &dyn Store,
    key: &str,
    timeout: Duration,
    interrupted: Interrupt<'_>,
) -> Result<Vec<u8>> {
    if !interruptible(store) {
        return store.get_timeout(key, timeout);
    }
    store
        .block_interruptibly(Blocking::Get(key), timeout, interrupted)?
        .value("get")
}

/// Waits up to `timeout` (zero: forever) until every key is there.
pub fn wait(
    store: &dyn Store,
    keys: &[String],
    timeout: Duration,
    interrupted: Interrupt<'_>,
) -> Result<()> {
    if !interruptible(store) {
        return store.wait(keys, Some(timeout));
    }
    store
        .block_interruptibly(Blocking::Wait(keys), timeout, interrupted)?
        .ready("wait")
}

/// The values of every key, waiting for them up to the store's timeout. A store that cannot
/// check for an interruption waits inside its own `multi_get`, as torch's PrefixStore leaves
/// it to.
pub fn multi_get(
    store: &dyn Store,
    keys: &[String],
    interrupted: Interrupt<'_>,
) -> Result<Vec<Vec<u8>>> {
    if !interruptible(store) {
        return store.multi_get(keys);
    }
    store
        .block_interruptibly(Blocking::MultiGet(keys), store.timeout(), interrupted)?
        .values("multi_get")
}

/// Pops the front of queue `key`, waiting up to `timeout` (zero: forever) for an element.
pub fn queue_pop(
    store: &dyn Store,
    key: &str,
    timeout: Duration,
    interrupted: Interrupt<'_>,
) -> Result<Vec<u8>> {
    if !interruptible(store) {
        return store.queue_pop_timeout(key, timeout);
    }
    store
        .block_interruptibly(Blocking::QueuePop(key), timeout, interrupted)?
        .value("queue_pop")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::store::HashStore;

    /// A HashStore that reports the capabilities it is given and counts plain `wait` calls.
    struct Reporting {
        inner: HashStore,
        capabilities: Capabilities,
        waits: AtomicUsize,
    }

    impl Store for Reporting {
        fn set(&self, key: &str, value: &[u8]) -> Result<()> {
            self.inner.set(key, value)
        }
        fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
            self.inner.get_timeout(key, timeout)
        }
        fn add(&self, key: &str, amount: i64) -> Result<i64> {
            self.inner.add(key, amount)
        }
        fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
            self.inner.compare_set(key, expected, desired)
        }
        fn check(&self, keys: &[String]) -> Result<bool> {
            self.inner.check(keys)
        }
        fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
            self.waits.fetch_add(1, Ordering::SeqCst);
            self.inner.wait(keys, timeout)
        }
        fn delete_key(&self, key: &str) -> Result<bool> {
            self.inner.delete_key(key)
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
            self.inner.clone_store()
        }
        fn capabilities(&self) -> Capabilities {
            self.capabilities
        }
    }

    fn reporting(interruptible_waits: bool) -> Reporting {
        Reporting {
            inner: HashStore::new(),
            capabilities: Capabilities {
                interruptible_waits,
                ..Capabilities::BASIC
            },
            waits: AtomicUsize::new(0),
        }
    }

    #[test]
    fn a_wait_is_sliced_and_checked_only_where_the_store_says_it_is_cheap() {
        let keys = ["never".to_owned()];
        let timeout = Duration::from_millis(350);
        for interruptible in [true, false] {
            let store = reporting(interruptible);
            let mut checks = 0;
            let err = wait(&store, &keys, timeout, &mut || {
                checks += 1;
                Ok(())
            })
            .unwrap_err();
            assert!(
                matches!(err, Error::Timeout { after, .. } if after == timeout),
                "{err:?}: the whole timeout is reported"
            );
            let waits = store.waits.load(Ordering::SeqCst);
            if interruptible {
                assert!(waits >= 3 && checks >= 3, "{waits} slices, {checks} checks");
            } else {
                assert_eq!((waits, checks), (1, 0), "one call with all the time left");
            }
        }
    }

    #[test]
    fn an_interruption_ends_a_sliced_call_with_its_error() {
        let store = reporting(true);
        store.set("there", b"v").unwrap();
        let keys = ["there".to_owned(), "missing".to_owned()];
        let err = multi_get(&store, &keys, &mut || Err(Error::Interrupted)).unwrap_err();
        assert!(matches!(err, Error::Interrupted), "{err:?}");
        assert_eq!(
            get(&store, "there", Duration::from_secs(1), &mut || Ok(())).unwrap(),
            b"v"
        );
    }
}
