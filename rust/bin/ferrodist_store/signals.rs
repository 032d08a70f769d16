//! SIGINT and SIGTERM for `ferrodist-store`, caught from the process's first instant.
//!
//! Between `exec` and the moment tokio's handlers exist, the default action would kill the
//! server without a drain, and a Python launcher that ignores SIGINT while it starts loses the
//! signal altogether. So `main` calls [`hold`] before anything else: both signals are blocked
//! (a signal that arrives is kept pending, not acted on), and [`Termination::install`]
//! registers the handlers first and unblocks second, which delivers a pending signal to them.
//! The unblocking is explicit, so a server started by a parent that had them blocked still
//! hears them.
//!
//! Threads spawned while the signals are held (the runtime's workers) inherit the blocked mask;
//! that is harmless, since a process-directed signal goes to a thread that does not block it,
//! and the thread that installed the handlers does not.

use ferrodist::error::Result;

/// The signals the server stops on.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset only write to the set we own; both signal numbers are valid.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

fn mask(how: libc::c_int) -> std::io::Result<()> {
    let set = stop_signals();
    // SAFETY: a valid set and a null "old set"; pthread_sigmask affects only the calling thread.
    match unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread until [`Termination::install`] runs there.
pub fn hold() -> std::io::Result<()> {
    mask(libc::SIG_BLOCK)
}

/// SIGTERM and SIGINT handlers, installed when built (so no signal is lost after that).
pub struct Termination {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Termination {
    /// Registers the handlers, then unblocks both signals in the calling thread, so one held
    /// pending since [`hold`] reaches them. Call it inside the runtime, on the thread that
    /// called [`hold`].
    pub fn install() -> Result<Termination> {
        use tokio::signal::unix::{signal, SignalKind};
        let termination = Termination {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        };
        mask(libc::SIG_UNBLOCK)?;
        Ok(termination)
    }

    /// Resolves with the signal's name once one arrives.
    pub async fn received(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked_now() -> bool {
        // SAFETY: reads the calling thread's mask into a set we own.
        unsafe {
            let mut current: libc::sigset_t = std::mem::zeroed();
            assert_eq!(
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut current),
                0
            );
            libc::sigismember(&current, libc::SIGTERM) == 1
        }
    }

    #[test]
    fn a_signal_held_before_install_reaches_the_handler() {
        // On a thread of its own: the mask is per thread, and the test harness shares threads.
        std::thread::spawn(|| {
            hold().unwrap();
            assert!(blocked_now());
            // Sent while held: pending, not acted on (the default action would end the test
            // binary). Sent to this thread only, so no other test's thread can take it.
            // SAFETY: signalling our own thread with a valid signal number.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let name = rt.block_on(async {
                let mut stop = Termination::install().unwrap();
                tokio::time::timeout(std::time::Duration::from_secs(10), stop.received()).await
            });
            assert_eq!(name, Ok("SIGTERM"));
            assert!(!blocked_now());
        })
        .join()
        .unwrap();
    }
}
