//! How long one connection may keep the server's worker before the others get a turn.
//!
//! Every connection runs on the one runtime worker (see `runtime.rs`), so a connection that
//! never waits holds up all the others. tokio's cooperative budget makes a task yield after
//! 128 socket operations, but one operation here can be a window of a 100K-key MULTI_GET reply
//! (256 lookups and a write): 128 of them kept another client's small SET + GET waiting about
//! 7 ms each, and a client sending one every 4 ms fell further behind with every one (its p99
//! rose by 0.5-1.2 s on a 2-core machine). So a connection's turn is measured in time: after
//! [`WORK_SLICE`] of work in one poll it yields, and the runtime polls the I/O driver and runs
//! whatever became ready before coming back to it.

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The longest a connection works in one turn (one poll of its task).
pub const WORK_SLICE: Duration = Duration::from_micros(500);

/// One turn of a connection's task.
pub struct Turn {
    ends: Instant,
}

impl Turn {
    /// A turn starting now.
    pub fn start() -> Turn {
        Turn {
            ends: Instant::now() + WORK_SLICE,
        }
    }

    /// Ready while the turn lasts; once it is over, asks to be polled again after the tasks
    /// that are ready now, and pends.
    pub fn poll_continue(&self, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() < self.ends {
            return Poll::Ready(());
        }
        crate::runtime::yield_turn(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_spent_turn_yields_and_the_task_is_polled_again() {
        let mut polls = 0u32;
        std::future::poll_fn(|cx| {
            polls += 1;
            let turn = Turn::start();
            if polls == 1 {
                std::thread::sleep(WORK_SLICE); // spend the whole turn
            }
            turn.poll_continue(cx)
        })
        .await;
        assert_eq!(
            polls, 2,
            "pended once, then was woken and went on in a fresh turn"
        );
    }
}
