//! A [`Store`] over a store ferrodist did not build (torch's `TCPStore`, `FileStore`, a user's
//! subclass of `torch.distributed.Store`), so core algorithms (PrefixStore, control
//! collectives) run over it with the deadlines and errors of a native store.
//!
//! The bindings reach the foreign store through [`ForeignCalls`]: each method is one call of
//! the store's own API, with its failure mapped to a core error by the exception's class alone.
//! What a class cannot say is decided here:
//!
//! * **Each call keeps its own deadline.** A foreign `get` waits by the store's timeout, which
//!   may be far longer than the caller's (a collective of 2 s over a `TCPStore` of 30 s waited
//!   60 s: a slice of the store's timeout, and another). A `get` with a shorter timeout is a
//!   `wait` of the key with that timeout, then the `get` of a key that is there. A store whose
//!   `wait` fails for another reason than time (torch's base class raises for a subclass that
//!   has none) gets its plain `get`, which its own timeout bounds.
//! * **One call per wait.** Its [`Capabilities`] say its waits are not interruptible, so
//!   [`super::blocking`] makes one call with all the time left, not slices of
//!   [`super::INTERRUPT_POLL`]: torch's `TCPStore` client logs two warnings per timed-out wait
//!   and `FileStore` rounds each up to a second. Ctrl-C is seen when the call returns, as with
//!   torch's own collectives.
//! * **Whether a failure is a timeout.** A failure whose class does not say
//!   ([`Error::Store`]: torch's `DistStoreError`, a plain `RuntimeError`, a user's own class)
//!   from a call that waits is a timeout if, and only if, the call's timeout had passed when it
//!   failed. torch's stores raise their timeouts in that family (HashStore's and TCPStore's are
//!   `DistStoreError`, FileStore's `get` a plain `RuntimeError`), but also real failures (a
//!   store file that became a directory): the class cannot tell them apart, the clock can,
//!   whatever the message says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Capabilities, Store, DEFAULT_TIMEOUT};
use crate::error::{Error, Result};

/// The foreign store's own calls, one each; errors mapped by class only (a timeout class to
/// [`Error::Timeout`], an unclassified failure to [`Error::Store`]).
pub trait ForeignCalls: Send + Sync {
    /// `set(key, value)`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// `get(key)`, which waits by the store's own timeout.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// `add(key, amount)`.
    fn add(&self, key: &str, amount: i64) -> Result<i64>;
    /// `compare_set(key, expected, desired)`.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;
    /// `check(keys)`.
    fn check(&self, keys: &[String]) -> Result<bool>;
    /// `wait(keys, timeout)`, or `wait(keys)` (the store's timeout) for `None`.
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()>;
    /// `delete_key(key)`.
    fn delete_key(&self, key: &str) -> Result<bool>;
    /// `num_keys()`.
    fn num_keys(&self) -> Result<i64>;
    /// The store's `timeout`.
    fn timeout(&self) -> Result<Duration>;
    /// `set_timeout(timeout)`.
    fn set_timeout(&self, timeout: Duration) -> Result<()>;
    /// `clone()`, as calls of its own.
    fn clone_calls(&self) -> Result<Box<dyn ForeignCalls>>;
    /// `has_extended_api()`.
    fn has_extended_api(&self) -> Result<bool>;
    /// `append(key, value)`.
    fn append(&self, key: &str, value: &[u8]) -> Result<()>;
    /// `multi_get(keys)`, which waits by the store's own timeout.
    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>>;
    /// `multi_set(keys, values)`.
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()>;
    /// `queue_push(key, value)`.
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()>;
    /// `queue_pop(key, block)`; a blocking pop waits by the store's own timeout.
    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>>;
    /// `queue_len(key)`.
    fn queue_len(&self, key: &str) -> Result<i64>;
    /// `list_keys()`.
    fn list_keys(&self) -> Result<Vec<String>>;
    /// `barrier(key, world_size, timeout)`.
    fn barrier(&self, key: &str, world_size: i64, timeout: Duration) -> Result<()>;
}

/// How much earlier than its timeout a failed wait still counts as timed out: torch's TCPStore
/// waits whole milliseconds, and the clocks of two languages are read at different moments.
const TIMEOUT_SLACK: Duration = Duration::from_millis(5);

/// `err`, from a call of `op` that may wait up to `timeout` (zero: no limit) and failed after
/// `elapsed`, as the error a native store gives: a timeout when its class says so, or when
/// its class says nothing and the time had passed (see the module doc).
pub fn judged(op: &str, err: Error, timeout: Duration, elapsed: Duration) -> Error {
    let passed = !timeout.is_zero() && elapsed + TIMEOUT_SLACK >= timeout;
    let timed_out = |detail| Error::Timeout {
        op: op.to_string(),
        after: timeout,
        detail,
    };
    match err {
        Error::Timeout { detail, .. } => timed_out(detail),
        Error::Store(detail) if passed => timed_out(detail),
        other => other,
    }
}

/// A core store over a foreign one (see the module doc).
pub struct ForeignStore {
    calls: Box<dyn ForeignCalls>,
}

impl ForeignStore {
    /// A store over `calls`.
    pub fn new(calls: Box<dyn ForeignCalls>) -> Self {
        ForeignStore { calls }
    }

    /// Runs `call`, which may wait up to `timeout` (`None`: the store's own, read only if it
    /// fails), and judges its failure.
    fn waiting<T>(
        &self,
        op: &str,
        timeout: Option<Duration>,
        call: impl FnOnce(&dyn ForeignCalls) -> Result<T>,
    ) -> Result<T> {
        let started = Instant::now();
        call(&*self.calls).map_err(|err| {
            let timeout = timeout.unwrap_or_else(|| self.timeout());
            judged(op, err, timeout, started.elapsed())
        })
    }

    /// The foreign `wait` of `keys` for `op`, a timeout naming the keys.
    fn wait_for(&self, op: &str, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.waiting(op, timeout, |calls| calls.wait(keys, timeout))
            .map_err(|err| match err {
                Error::Timeout { after, .. } => Error::wait_timeout(op, after, keys),
                other => other,
            })
    }
}

impl Store for ForeignStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.calls.set(key, value)
    }

    /// The store's own `get`, by its own timeout (as torch's PrefixStore forwards it).
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.waiting("get", None, |calls| calls.get(key))
    }

    /// A `wait` with `timeout`, then the `get` of a key that is there; one `get` when `timeout`
    /// is the store's own (see the module doc).
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        if timeout == self.timeout() {
            return self.get(key);
        }
        match self.wait_for("get", &[key.to_owned()], Some(timeout)) {
            Ok(()) | Err(Error::Store(_) | Error::NotImplemented(_)) => self.get(key),
            Err(err) => Err(err),
        }
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        self.calls.add(key, amount)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.calls.compare_set(key, expected, desired)
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        self.calls.check(keys)
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.wait_for("wait", keys, timeout)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.calls.delete_key(key)
    }

    fn num_keys(&self) -> Result<i64> {
        self.calls.num_keys()
    }

    fn timeout(&self) -> Duration {
        self.calls.timeout().unwrap_or(DEFAULT_TIMEOUT)
    }

    /// A store that refuses a new timeout keeps its old one; there is no error to report.
    fn set_timeout(&self, timeout: Duration) {
        let _ = self.calls.set_timeout(timeout);
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(ForeignStore::new(self.calls.clone_calls()?)))
    }

    /// Waits are one call each (see the module doc) and torch's TCPStore client has no
    /// deadline on a write.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            extended_api: self.calls.has_extended_api().unwrap_or(false),
            interruptible_waits: false,
            in_memory: false,
            bounded_writes: false,
        }
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.calls.append(key, value)
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        self.waiting("multi_get", None, |calls| calls.multi_get(keys))
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        self.calls.multi_set(keys, values)
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.calls.queue_push(key, value)
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        if !block {
            return self.calls.queue_pop(key, false);
        }
        self.waiting("queue_pop", None, |calls| calls.queue_pop(key, true))
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        self.calls.queue_len(key)
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        self.calls.list_keys()
    }

    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        self.waiting("barrier", Some(timeout), |calls| {
            calls.barrier(key, world_size, timeout)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn an_unnamed_failure_is_a_timeout_only_once_the_time_has_passed() {
        let failed = || Error::Store("wait timeout after 1000ms".into());
        let early = judged("wait", failed(), SECOND, Duration::from_millis(500));
        assert!(matches!(early, Error::Store(_)), "{early:?}");
        let late = judged("wait", failed(), SECOND, Duration::from_millis(996));
        assert!(
            matches!(late, Error::Timeout { after, .. } if after == SECOND),
            "{late:?}"
        );
        // No limit (zero) never passes; a class that says what it is keeps saying it.
        let endless = judged("wait", failed(), Duration::ZERO, 10 * SECOND);
        assert!(matches!(endless, Error::Store(_)), "{endless:?}");
        let network = judged("wait", Error::Network("reset".into()), SECOND, 2 * SECOND);
        assert!(matches!(network, Error::Network(_)), "{network:?}");
        let named = Error::Timeout {
            op: "x".into(),
            after: Duration::ZERO,
            detail: "TimeoutError".into(),
        };
        let named = judged("get", named, SECOND, Duration::ZERO);
        assert!(
            matches!(named, Error::Timeout { ref op, after, .. } if op == "get" && after == SECOND)
        );
    }
}
