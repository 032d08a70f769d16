//! The Store abstraction: a small key/value service that ranks use to find each other.
//!
//! The trait mirrors torch's `c10d::Store` (set, get, add, compare_set, wait, queues, ...), so
//! every implementation can stand in for a torch store. Two decisions shape it:
//!
//! * **Every blocking call has a deadline.** `get`, `wait`, blocking `queue_pop` and `barrier`
//!   use the store's timeout unless given one; a zero timeout means "no deadline", as in torch.
//!   [`blocking`] lets a caller (Python) check for Ctrl-C every [`INTERRUPT_POLL`] without
//!   losing the overall deadline or its error message: by default [`sliced`] cuts the wait
//!   into short slices; HashStore and EtcdStore check beside one wait that stays armed
//!   ([`facade`]).
//! * **What a store can do is one value** ([`Capabilities`]), read by the core where it
//!   decides how to call the store.
//! * **Defaults match torch's base class.** A store that lacks an operation gets torch's
//!   fallback (append as a compare_set loop, multi_get one key at a time, barrier from add +
//!   wait) or torch's `NotImplemented` error (queues, list_keys).

pub mod blocking;
mod capabilities;
pub mod db;
pub mod db_engine;
mod deadline;
pub mod engine;
mod entries;
pub mod facade;
pub mod hash;
pub mod waiters;
// --- file and prefix stores ---
pub mod file;
mod file_lock;
pub mod file_log;
pub mod prefix;
pub mod roll;
// --- stores ferrodist did not build ---
pub mod foreign;
// --- etcd store ---
pub mod etcd;

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

pub use blocking::{Blocking, Unblocked};
pub use capabilities::Capabilities;
pub use deadline::{popped_now, retry_until, sliced, Deadline};
pub use file::FileStore;
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use roll::Roll;
// --- etcd store ---
pub use etcd::{EtcdEngine, EtcdOptions, EtcdStore};

/// torch's `kDefaultTimeout`: 300 s for every store unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest uninterrupted slice of a wait when the caller wants to poll for interrupts.
pub const INTERRUPT_POLL: Duration = Duration::from_millis(100);

/// Called between slices of a long wait; an `Err` (Ctrl-C in Python) ends the wait with it.
pub type Interrupt<'a> = &'a mut dyn FnMut() -> Result<()>;

/// A torch-compatible key/value store. Keys are strings, values raw bytes.
///
/// Implementations are shared across threads (`Arc<dyn Store>`) and every method may be called
/// concurrently.
pub trait Store: Send + Sync {
    /// Stores `value` under `key`, waking waiters on it.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Returns the value of `key`, waiting up to the store timeout for it to appear.
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.timeout())
    }

    /// Returns the value of `key`, waiting up to `timeout` (zero: forever) for it to appear.
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Adds `amount` to the integer stored (as decimal text) under `key`, creating it at 0.
    fn add(&self, key: &str, amount: i64) -> Result<i64>;

    /// Sets `key` to `desired` if its value equals `expected` (or it is missing and `expected`
    /// is empty). Returns the value after the call, with torch's quirk for a missing key.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;

    /// True iff every key is present (now, without waiting).
    fn check(&self, keys: &[String]) -> Result<bool>;

    /// Waits until every key is present; `timeout` of `None` uses the store timeout.
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()>;

    /// Removes `key`; true iff it existed (FileStore always says true, as torch's does).
    fn delete_key(&self, key: &str) -> Result<bool>;

    /// Number of keys, internal ones included (as torch counts them).
    fn num_keys(&self) -> Result<i64>;

    /// The store's default timeout for blocking calls.
    fn timeout(&self) -> Duration;

    /// Changes the default timeout for blocking calls.
    fn set_timeout(&self, timeout: Duration);

    /// A new handle to the same store (torch's `clone()`).
    fn clone_store(&self) -> Result<Arc<dyn Store>>;

    /// What this store can do beyond the common calls (see [`Capabilities`]).
    fn capabilities(&self) -> Capabilities {
        Capabilities::BASIC
    }

    /// Appends `value` to `key` (creating it). Default: torch's compare_set retry loop.
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut expected: Vec<u8> = Vec::new();
        loop {
            let mut desired = expected.clone();
            desired.extend_from_slice(value);
            let now = self.compare_set(key, &expected, &desired)?;
            if now == desired {
                return Ok(());
            }
            expected = now;
        }
    }

    /// Gets every key, waiting for each against one shared deadline. Default: one get per key.
    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// Sets every pair in order. Default: one set per pair.
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        same_length(keys, values)?;
        keys.iter()
            .zip(values)
            .try_for_each(|(k, v)| self.set(k, v))
    }

    /// Pushes `value` on the queue named `key`.
    fn queue_push(&self, _key: &str, _value: &[u8]) -> Result<()> {
        Err(Error::NotImplemented(
            "queue support is not implemented.".into(),
        ))
    }

    /// Pops the front of queue `key`; with `block`, first waits (store timeout) for an element.
    fn queue_pop(&self, _key: &str, _block: bool) -> Result<Vec<u8>> {
        Err(Error::NotImplemented(
            "queue support is not implemented.".into(),
        ))
    }

    /// Pops the front of queue `key`, waiting up to `timeout` (zero: forever) for an element.
    /// A timeout pops nothing, so a caller may repeat the call (see [`sliced`]).
    ///
    /// Default: pop without blocking; while the queue is empty, wait for it and try again
    /// within the same deadline (so an element another consumer took in between costs a wait,
    /// where torch's TCPStore raises `QueueEmptyError`).
    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let keys = [key.to_owned()];
        retry_until(
            "queue_pop",
            &keys,
            timeout,
            || popped_now(self.queue_pop(key, false)),
            |left| self.wait(&keys, Some(left)),
        )
    }

    /// Length of queue `key`, 0 when it does not exist.
    fn queue_len(&self, _key: &str) -> Result<i64> {
        Err(Error::NotImplemented(
            "queue support is not implemented.".into(),
        ))
    }

    /// Every user-visible key.
    fn list_keys(&self) -> Result<Vec<String>> {
        Err(Error::NotImplemented(
            "listKeys support is not implemented.".into(),
        ))
    }

    /// One blocking call, checking `interrupted` at least every [`INTERRUPT_POLL`]; an `Err`
    /// from it ends the call with that error (Ctrl-C in Python). Callers go through
    /// [`blocking`], which calls this only where [`Capabilities::interruptible_waits`] holds.
    /// Default: the plain call in slices ([`blocking::in_slices`]).
    fn block_interruptibly(
        &self,
        call: Blocking<'_>,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Unblocked> {
        blocking::in_slices(self, call, timeout, interrupted)
    }

    /// The value of `key` if it is there now, looked up without waiting and without blocking
    /// (only an in-memory store answers; `None` sends the caller to [`Store::get_timeout`]).
    /// The bindings try it first, with the GIL held, so a GET of a key that is there costs no
    /// GIL release.
    fn get_now(&self, _key: &str) -> Option<Vec<u8>> {
        None
    }

    /// The store's own rolls where it has them (EtcdStore: a key per member); `None` lets the
    /// rendezvous build its rolls from `append` and `add` ([`roll`]).
    fn roll(&self) -> Option<&dyn Roll> {
        None
    }

    /// Blocks until `world_size` callers have reached the barrier named `key`.
    /// Default: torch's fallback from add + wait on `key/num_members` and `key/last_member`.
    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<()> {
        let arrived = self.add(&format!("{key}/num_members"), 1)?;
        let last = format!("{key}/last_member");
        if arrived == world_size {
            self.set(&last, b"1")?;
        }
        self.wait(&[last], timeout).map_err(|err| match err {
            Error::Timeout { after, .. } => Error::Timeout {
                op: "barrier".into(),
                after,
                detail: format!("key: {key}"),
            },
            other => other,
        })
    }
}

/// `multi_set`'s one argument rule, for every store: as many values as keys.
pub fn same_length(keys: &[String], values: &[Vec<u8>]) -> Result<()> {
    if keys.len() == values.len() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "multi_set: {} keys but {} values",
        keys.len(),
        values.len()
    )))
}

/// Parses a counter the way torch's stores do (`std::stoll`): optional leading whitespace and
/// sign, then the longest run of digits. A missing or empty value counts as 0 only where the
/// caller decides so; here empty and non-numeric values are an error.
pub fn parse_counter(key: &str, value: &[u8]) -> Result<i64> {
    // Bytes, not text: a value that is not UTF-8 after its digits still parses, as with stoll.
    let start = value
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        .unwrap_or(value.len());
    let rest = &value[start..];
    let (sign, digits) = match rest.first() {
        Some(b'-') => (-1i128, &rest[1..]),
        Some(b'+') => (1i128, &rest[1..]),
        _ => (1i128, rest),
    };
    let run = &digits[..digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len())];
    let bad = || {
        // The value itself stays out of the message: it may be large or secret, and servers
        // log this text.
        Error::InvalidArgument(format!(
            "add: the value of key '{key}' is not a decimal integer ({} bytes)",
            value.len()
        ))
    };
    if run.is_empty() {
        return Err(bad());
    }
    let magnitude: i128 = std::str::from_utf8(run)
        .expect("ASCII digits")
        .parse()
        .map_err(|_| bad())?;
    i64::try_from(sign * magnitude).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_parsing_follows_stoll() {
        assert_eq!(parse_counter("k", b"12abc").unwrap(), 12);
        assert_eq!(parse_counter("k", b"  +7").unwrap(), 7);
        assert_eq!(parse_counter("k", b"-3").unwrap(), -3);
        assert_eq!(parse_counter("k", b"\t-3\0\xff").unwrap(), -3);
        assert!(parse_counter("k", b"").is_err());
        assert!(parse_counter("k", b"abc").is_err());
        assert!(parse_counter("k", b"99999999999999999999").is_err());
    }

    #[test]
    fn zero_timeout_never_expires() {
        let deadline = Deadline::after(Duration::ZERO);
        assert!(deadline.remaining().is_none());
        assert!(!deadline.expired());
    }
}
