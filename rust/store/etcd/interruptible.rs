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
use crate::error::Result;
use crate::runtime::runtime;
use crate::store::{popped_now, Deadline, Interrupt, Store, INTERRUPT_POLL};

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

    /// A blocking queue pop, as the trait's default `queue_pop_timeout` with the wait
    /// interruptible: pop without blocking, and while the queue is empty wait for it (beside
    /// the interruption check) and try again within the same deadline.
    pub(super) fn pop_when_pushed(
        &self,
        key: &str,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Vec<u8>> {
        self.retry_watching("queue_pop", &[key.to_owned()], timeout, interrupted, || {
            popped_now(self.queue_pop(key, false))
        })
    }
}
