//! The one tokio runtime of the process.
//!
//! Built lazily on first use, never at import, so `import ferrodist` costs nothing and a process
//! that only uses in-memory stores never starts a thread. A forked child (DataLoader workers)
//! must not touch the parent's runtime: its worker threads do not exist in the child. So the
//! runtime remembers the pid that built it and a child builds its own; the parent's copy is
//! leaked in the child on purpose, since dropping it would try to join threads that are gone.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::runtime::{Builder, Runtime};

/// Environment variable that overrides the number of worker threads.
pub const WORKER_THREADS_ENV: &str = "FERRODIST_RUNTIME_THREADS";

/// One worker: the runtime hosts the store server, whose work per request is tiny next to the
/// kernel's, and a second worker only adds cross-thread wake-ups. In a 4096-rank storm one
/// worker used the same CPU as `benches/storm_floor.rs` (the least any server can use) and two
/// used 18 % more, for the same wall time.
const DEFAULT_WORKER_THREADS: usize = 1;

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The process-wide runtime, built on first call (and again in a forked child).
pub fn runtime() -> Arc<Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Arc::clone(rt);
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // Inherited across fork: its threads are gone, so it must never be dropped here.
        std::mem::forget(inherited);
    }
    let threads = std::env::var(WORKER_THREADS_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_WORKER_THREADS);
    let rt = Arc::new(
        Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ferrodist-rt")
            .enable_all()
            .build()
            .expect("building the tokio runtime failed: out of threads or file descriptors"),
    );
    *slot = Some((pid, Arc::clone(&rt)));
    rt
}

/// Pends, asking to be polled again once the runtime has polled its I/O driver and run the
/// tasks that are ready now (outside a runtime: woken at once). For a task that stops in the
/// middle of long work to let others run.
///
/// A plain `cx.waker().wake_by_ref()` puts the task back in the run queue, but the worker polls
/// the I/O driver only every 61 task polls: a WAIT on 100K stored keys that yielded so every
/// 1,024 keys kept other connections' arrived requests unseen for milliseconds at a time.
pub fn yield_turn<T>(cx: &mut Context<'_>) -> Poll<T> {
    let _ = pin!(tokio::task::yield_now()).poll(cx);
    Poll::Pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_is_shared_within_a_process() {
        let a = runtime();
        let b = runtime();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.block_on(async { 2 + 2 }), 4);
    }
}
