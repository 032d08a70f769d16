//! Deadlines, and the two loops every blocking call is built from.
//!
//! Why one place: waiting "until a deadline, then give up naming what never came" is what every
//! store does, over sockets, files, etcd watches and foreign Python stores alike, and each
//! copy of the loop was a place for the reported timeout to drift from the one the caller
//! asked for. [`sliced`] cuts one repeatable call into slices so that an interruption is seen;
//! [`retry_until`] tries something that may not be there yet, waits for it, and tries again.

use std::time::{Duration, Instant};

use super::INTERRUPT_POLL;
use crate::error::{Error, Result};

/// A point in time after which a blocking call gives up; `None` waits forever
/// (torch's `kNoTimeout`, a zero timeout).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    /// A deadline `timeout` from now; zero means never.
    pub fn after(timeout: Duration) -> Self {
        let at = if timeout.is_zero() {
            None
        } else {
            Instant::now().checked_add(timeout)
        };
        Deadline { at, timeout }
    }

    /// The timeout this deadline was built from (for error messages).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The instant it passes, `None` when unbounded.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    /// Time left, `None` when unbounded; zero once passed.
    pub fn remaining(&self) -> Option<Duration> {
        self.at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// True once the deadline has passed.
    pub fn expired(&self) -> bool {
        self.remaining().is_some_and(|left| left.is_zero())
    }
}

/// Runs a blocking operation in slices of at most [`INTERRUPT_POLL`] so that `interrupted` can
/// run between them (Python checks for Ctrl-C there); an `Err` from it ends the call with that
/// error. `op` gets the length of each slice and is retried while it times out, until `timeout`
/// (zero: forever) has passed. The final timeout error reports the whole `timeout`, not a slice.
///
/// Only for operations that are safe to repeat after a timeout (get, wait, multi_get); not for
/// a server-side barrier, which counts each attempt.
pub fn sliced<T>(
    timeout: Duration,
    mut op: impl FnMut(Duration) -> Result<T>,
    interrupted: &mut dyn FnMut() -> Result<()>,
) -> Result<T> {
    let deadline = Deadline::after(timeout);
    loop {
        let (slice, last) = match deadline.remaining() {
            Some(left) if left <= INTERRUPT_POLL => (left.max(Duration::from_millis(1)), true),
            Some(_) | None => (INTERRUPT_POLL, false),
        };
        match op(slice) {
            Err(Error::Timeout { op, detail, .. }) if last => {
                return Err(Error::Timeout {
                    op,
                    after: timeout,
                    detail,
                })
            }
            Err(err) if err.is_timeout() => interrupted()?,
            other => return other,
        }
    }
}

/// Tries `attempt` until it yields a value; between tries, `wait(left)` waits for what it needs
/// (`left`: the time before the deadline, zero when there is none). Once `timeout` (zero:
/// forever) has passed, fails with a timeout of `op` naming `keys`; a timeout from `wait` is
/// reported with the whole `timeout`, not the part that was left.
///
/// For reads that may find nothing yet (a key not set, a queue another consumer emptied): the
/// read comes first, so a value that is already there costs one request.
pub fn retry_until<T>(
    op: &str,
    keys: &[String],
    timeout: Duration,
    mut attempt: impl FnMut() -> Result<Option<T>>,
    mut wait: impl FnMut(Duration) -> Result<()>,
) -> Result<T> {
    let deadline = Deadline::after(timeout);
    loop {
        if let Some(value) = attempt()? {
            return Ok(value);
        }
        let left = match deadline.remaining() {
            Some(left) if left.is_zero() => return Err(Error::wait_timeout(op, timeout, keys)),
            left => left.unwrap_or(Duration::ZERO),
        };
        wait(left).map_err(|err| err.with_whole_timeout(timeout))?;
    }
}

/// A non-blocking pop as an attempt of [`retry_until`]: an empty queue is "not yet".
pub fn popped_now(popped: Result<Vec<u8>>) -> Result<Option<Vec<u8>>> {
    match popped {
        Err(Error::QueueEmpty) => Ok(None),
        other => other.map(Some),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn a_retry_reads_first_and_reports_the_whole_timeout() {
        let keys = ["k".to_owned()];
        let tries = Cell::new(0);
        let found = retry_until(
            "get",
            &keys,
            Duration::from_secs(5),
            || {
                tries.set(tries.get() + 1);
                Ok((tries.get() == 2).then_some(7))
            },
            |_| Ok(()),
        );
        assert_eq!(found.unwrap(), 7);
        assert_eq!(tries.get(), 2, "read, wait, read");

        let timeout = Duration::from_millis(30);
        let err = retry_until::<()>(
            "get",
            &keys,
            timeout,
            || Ok(None),
            |left| Err(Error::wait_timeout("wait", left, &keys)),
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::Timeout { ref op, after, .. } if op == "wait" && after == timeout),
            "{err:?}"
        );
        let err = retry_until::<()>(
            "get",
            &keys,
            timeout,
            || Ok(None),
            |left| {
                std::thread::sleep(left);
                Ok(())
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::Timeout { ref op, after, .. } if op == "get" && after == timeout),
            "{err:?}"
        );
    }
}
