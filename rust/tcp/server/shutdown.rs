//! Graceful shutdown of a server: tell every task to stop, then wait until they all have.
//!
//! The mini-redis pattern, with a signal sized for tens of thousands of connections. "Stop" is a
//! flag plus a slab of wakers: a task that finds the flag unset parks its waker in the slab once
//! (one slot, reused for the connection's life; polls after that take no lock unless the task's
//! waker changed), and [`Trigger::fire`] sets the flag and wakes every parked task. Being
//! pollable, it costs a connection 24 bytes and no future of its own (a `watch` receiver's
//! `changed()` future cost ~100 bytes in every connection's task). A task that subscribes after
//! the signal still sees it. The signal also counts the live handles; when the last is dropped
//! the [`Drain`] completes.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use slab::Slab;
use tokio::sync::Notify;

/// What the trigger and every [`Shutdown`] share.
#[derive(Default)]
struct Signal {
    stopped: AtomicBool,
    parked: Mutex<Slab<Waker>>,
    /// [`Shutdown`] handles alive.
    live: AtomicUsize,
    /// Notified when `live` drops to zero.
    drained: Notify,
}

impl Signal {
    fn parked(&self) -> MutexGuard<'_, Slab<Waker>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The receiving side, one per task: learns that the server is shutting down.
pub struct Shutdown {
    signal: Arc<Signal>,
    /// This task's slot in the signal's slab, once it has parked a waker there.
    slot: Option<usize>,
    /// The data pointer of the waker parked in `slot`, to skip the lock while it is unchanged.
    parked_waker: usize,
}

impl Shutdown {
    fn new(signal: Arc<Signal>) -> Shutdown {
        signal.live.fetch_add(1, Ordering::AcqRel);
        Shutdown {
            signal,
            slot: None,
            parked_waker: 0,
        }
    }
}

impl Clone for Shutdown {
    fn clone(&self) -> Self {
        Shutdown::new(Arc::clone(&self.signal))
    }
}

impl Shutdown {
    /// True once shutdown has been requested.
    pub fn is_shutdown(&self) -> bool {
        self.signal.stopped.load(Ordering::Acquire)
    }

    /// Ready once shutdown is requested; otherwise arranges for `cx` to be woken when it is.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_shutdown() {
            return Poll::Ready(());
        }
        let waker = cx.waker().data() as usize;
        if self.slot.is_some() && waker == self.parked_waker {
            // Parked already with this very waker: `fire` will wake it.
            return Poll::Pending;
        }
        let mut parked = self.signal.parked();
        // Checked again under the lock: `fire` sets the flag before it takes the wakers.
        if self.is_shutdown() {
            return Poll::Ready(());
        }
        match self.slot.and_then(|slot| parked.get_mut(slot)) {
            Some(slot) => slot.clone_from(cx.waker()),
            None => self.slot = Some(parked.insert(cx.waker().clone())),
        }
        self.parked_waker = waker;
        Poll::Pending
    }

    /// Resolves when shutdown is requested (at once if it already was).
    pub async fn recv(&mut self) {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl Drop for Shutdown {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.signal.parked().try_remove(slot);
        }
        if self.signal.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.signal.drained.notify_waiters();
        }
    }
}

/// The sending side, held by whoever owns the server.
pub struct Trigger {
    signal: Arc<Signal>,
}

impl Trigger {
    /// Asks every task to stop. Idempotent.
    pub fn fire(&self) {
        self.signal.stopped.store(true, Ordering::Release);
        let wakers: Vec<Waker> = self.signal.parked().drain().collect();
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// Waits for every task holding a [`Shutdown`] to finish.
pub struct Drain {
    signal: Arc<Signal>,
}

impl Drain {
    /// Resolves once every [`Shutdown`] clone has been dropped.
    pub async fn wait(self) {
        loop {
            // Registered before the count is read, so a drop in between is not missed.
            let notified = self.signal.drained.notified();
            if self.signal.live.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A new trigger, the first receiver (clone it for each task) and the drain.
pub fn channel() -> (Trigger, Shutdown, Drain) {
    let signal = Arc::new(Signal::default());
    (
        Trigger {
            signal: Arc::clone(&signal),
        },
        Shutdown::new(Arc::clone(&signal)),
        Drain { signal },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Paused clock: the sleep returns once every other task is idle (all three parked), with
    // no real wait; a drain that never finished would still fail, at the timeout's virtual 5 s.
    #[tokio::test(start_paused = true)]
    async fn drain_finishes_after_every_task_saw_the_signal() {
        let (trigger, shutdown, drain) = channel();
        for _ in 0..3 {
            let mut task_shutdown = shutdown.clone();
            tokio::spawn(async move { task_shutdown.recv().await });
        }
        drop(shutdown);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(trigger.signal.parked().len(), 3, "every task parked first");
        trigger.fire();
        tokio::time::timeout(Duration::from_secs(5), drain.wait())
            .await
            .expect("drained");
    }

    #[tokio::test]
    async fn a_task_that_subscribes_after_the_signal_still_stops() {
        let (trigger, shutdown, _drain) = channel();
        trigger.fire();
        let mut late = shutdown.clone();
        tokio::time::timeout(Duration::from_secs(5), late.recv())
            .await
            .expect("sees the earlier signal");
        assert!(late.is_shutdown());
    }

    #[tokio::test]
    async fn finished_tasks_give_their_slots_back() {
        let (_trigger, shutdown, _drain) = channel();
        for _ in 0..100 {
            let mut task_shutdown = shutdown.clone();
            let parked = poll_fn(|cx| Poll::Ready(task_shutdown.poll_recv(cx))).await;
            assert!(parked.is_pending());
        }
        assert!(shutdown.signal.parked().is_empty());
    }

    struct Flag(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_task_whose_waker_changed_is_woken_through_the_new_one() {
        let (trigger, mut shutdown, _drain) = channel();
        let old = Arc::new(Flag(AtomicBool::new(false)));
        let new = Arc::new(Flag(AtomicBool::new(false)));
        let old_waker = Waker::from(Arc::clone(&old));
        let new_waker = Waker::from(Arc::clone(&new));
        for _ in 0..3 {
            let pending = shutdown.poll_recv(&mut Context::from_waker(&old_waker));
            assert!(pending.is_pending());
        }
        assert!(shutdown
            .poll_recv(&mut Context::from_waker(&new_waker))
            .is_pending());
        assert_eq!(shutdown.signal.parked().len(), 1);
        trigger.fire();
        assert!(new.0.load(Ordering::SeqCst) && !old.0.load(Ordering::SeqCst));
        assert!(shutdown
            .poll_recv(&mut Context::from_waker(&old_waker))
            .is_ready());
    }
}
