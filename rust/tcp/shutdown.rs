//! Graceful shutdown of a server: tell every task to stop, then wait until they all have.
//!
//! The mini-redis pattern: one `watch` channel carries "stop" to the accept loop and every
//! connection handler; each handler holds a clone of a `mpsc::Sender` it never sends on, so when
//! the last handler returns, the receiver's `recv()` yields `None` and the drain is complete.
//! A `watch` (not a `broadcast`) is used so a task that subscribes after the signal still sees it.

use tokio::sync::{mpsc, watch};

/// The receiving side, one per task: learns that the server is shutting down.
#[derive(Clone)]
pub struct Shutdown {
    stop: watch::Receiver<bool>,
    /// Held, never used, so that [`Drain::wait`] knows when every task has finished.
    _alive: mpsc::Sender<()>,
}

impl Shutdown {
    /// True once shutdown has been requested.
    pub fn is_shutdown(&self) -> bool {
        *self.stop.borrow()
    }

    /// Resolves when shutdown is requested (at once if it already was).
    pub async fn recv(&mut self) {
        // An error means the trigger was dropped, which also means "stop".
        let _ = self.stop.wait_for(|stop| *stop).await;
    }
}

/// The sending side, held by whoever owns the server.
pub struct Trigger {
    stop: watch::Sender<bool>,
}

impl Trigger {
    /// Asks every task to stop. Idempotent.
    pub fn fire(&self) {
        self.stop.send_replace(true);
    }
}

/// Waits for every task holding a [`Shutdown`] to finish.
pub struct Drain {
    done: mpsc::Receiver<()>,
}

impl Drain {
    /// Resolves once every [`Shutdown`] clone has been dropped.
    pub async fn wait(mut self) {
        let _ = self.done.recv().await;
    }
}

/// A new trigger, the first receiver (clone it for each task) and the drain.
pub fn channel() -> (Trigger, Shutdown, Drain) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (alive_tx, alive_rx) = mpsc::channel(1);
    (
        Trigger { stop: stop_tx },
        Shutdown {
            stop: stop_rx,
            _alive: alive_tx,
        },
        Drain { done: alive_rx },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_finishes_after_every_task_saw_the_signal() {
        let (trigger, shutdown, drain) = channel();
        for _ in 0..3 {
            let mut task_shutdown = shutdown.clone();
            tokio::spawn(async move { task_shutdown.recv().await });
        }
        drop(shutdown);
        trigger.fire();
        tokio::time::timeout(std::time::Duration::from_secs(5), drain.wait())
            .await
            .expect("drained");
    }
}
