//! Waits that Ctrl-C ends promptly while one watch stays armed.
//!
//! Python notices Ctrl-C only when a thread takes the GIL and checks for it. Other stores let
//! the caller do that between short slices of a wait ([`crate::store::sliced`]), but here every
//! slice would read the keys again and set up a new watch: a round trip each, and with a
//! thousand ranks waiting in a rendezvous, ten thousand new watches a second. So a wait keeps
//! one watch for its whole timeout, and the thread that blocks on it wakes every
//! [`INTERRUPT_POLL`] to run the check beside it; an interrupt drops the wait (and so cancels
//! its watch) at once.

use std::future::Future;
use std::time::Duration;

use super::EtcdStore;
use crate::error::{Error, Result};
use crate::runtime::runtime;
use crate::store::{Deadline, Interrupt, Store, INTERRUPT_POLL};

impl EtcdStore {
    /// Runs `waiting` on this thread until it ends, `timeout` (zero: never) passes (`None`) or
    /// `interrupted` fails (its error), calling `interrupted` every [`INTERRUPT_POLL`].
    pub(super) fn watching<T>(
        &self,
        waiting: impl Future<Output = Result<T>>,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Option<Result<T>> {
        let deadline = Deadline::after(timeout);
        runtime().block_on(async {
            let mut waiting = std::pin::pin!(waiting);
            loop {
                let slice = match deadline.remaining() {
                    Some(left) if left.is_zero() => return None,
                    Some(left) => left.min(INTERRUPT_POLL),
                    None => INTERRUPT_POLL,
                };
                if let Ok(done) = tokio::time::timeout(slice, waiting.as_mut()).await {
                    return Some(done);
                }
                if let Err(err) = interrupted() {
                    return Some(Err(err));
                }
            }
        })
    }

    /// A blocking queue pop: wait for the queue, pop without blocking, and wait again within
    /// the same deadline when another consumer took the element first (as the trait's default
    /// `queue_pop_timeout`, with the wait interruptible).
    pub(super) fn pop_when_pushed(
        &self,
        key: &str,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Vec<u8>> {
        let deadline = Deadline::after(timeout);
        let keys = [key.to_owned()];
        loop {
            let left = match deadline.remaining() {
                Some(left) if left.is_zero() => {
                    return Err(Error::wait_timeout("queue_pop", timeout, &keys))
                }
                left => left.unwrap_or(Duration::ZERO),
            };
            self.present(&keys, left, "wait", interrupted)
                .map_err(|err| err.with_whole_timeout(timeout))?;
            match self.queue_pop(key, false) {
                Err(Error::QueueEmpty) => continue,
                popped => return popped,
            }
        }
    }
}
