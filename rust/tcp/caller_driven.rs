//! [`CallerDriven`]: a store connection's socket, driven by the thread that makes the call.
//!
//! Why each blocking store has one instead of using the process's shared runtime for its
//! connection: the shared runtime's I/O driver lives on its worker threads, so every request a
//! Python caller made paid two cross-thread wake-ups (the reply's readiness seen by a worker,
//! then the caller unparked) on top of the network round trip: about 30 µs, which made a
//! `get` or `add` slower than torch's client, whose blocking socket is read by the caller itself.
//! A current-thread runtime has no threads of its own: `block_on` polls the socket right on the
//! calling thread, and several callers of one store take turns driving it. Servers, and anything
//! that must make progress between calls, stay on the shared runtime ([`crate::runtime`]).

use std::future::Future;

use crate::error::Result;

/// A thread-less runtime whose I/O and timers are driven only inside [`CallerDriven::block_on`].
pub struct CallerDriven {
    runtime: Option<tokio::runtime::Runtime>,
}

impl CallerDriven {
    /// A new driver (an epoll instance and a timer wheel; no threads).
    pub fn new() -> Result<CallerDriven> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(CallerDriven {
            runtime: Some(runtime),
        })
    }

    /// Runs `future` to completion on the calling thread. Must not be called from async code.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(future)
    }
}

impl Drop for CallerDriven {
    fn drop(&mut self) {
        // Never blocks, so a store may be dropped anywhere (even on a runtime thread).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
