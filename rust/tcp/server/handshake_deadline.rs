//! Connections that never send VALIDATE are closed once their handshake deadline passes.
//!
//! torch's clients send VALIDATE as soon as they connect. A connection that sends nothing (a
//! port scanner, a half-open client, an attacker holding descriptors) would otherwise be kept
//! for ever. Giving every connection's task a timer would grow it past the 384-byte task class
//! that a 16,384-rank storm relies on, so one sweeper per process watches the unvalidated ones
//! instead: it holds a duplicate of each socket (so it can never touch a descriptor number the
//! kernel reused) and shuts the socket down when its deadline passes, which the connection's
//! task sees as the peer closing. A connection that validates, or ends, leaves the watch list;
//! on a server with an auth token, one that validates stays on it until it has also proven it
//! holds the token (see `handler/admission.rs`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use slab::Slab;

use super::log_budget::LogBudget;

/// How often the sweeper looks for passed deadlines.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// A connection's place in the watch list.
pub type Slot = u32;

struct Watched {
    deadline: Instant,
    socket: socket2::Socket,
}

static WATCHED: Mutex<Slab<Watched>> = Mutex::new(Slab::new());
/// The process whose runtime runs the sweeper (a forked child starts its own).
static SWEEPER_PID: AtomicU32 = AtomicU32::new(0);
static CLOSED_LOG: LogBudget = LogBudget::new(1);

fn watched() -> std::sync::MutexGuard<'static, Slab<Watched>> {
    WATCHED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Watches `stream` until it validates or `within` passes; `None` when it cannot be watched
/// (no descriptor to duplicate), and then it is simply not timed out. Must run on the runtime.
pub fn watch(stream: &tokio::net::TcpStream, within: Duration) -> Option<Slot> {
    let socket = socket2::SockRef::from(stream).try_clone().ok()?;
    let pid = std::process::id();
    if SWEEPER_PID.swap(pid, Ordering::Relaxed) != pid {
        tokio::spawn(sweep());
    }
    let slot = watched().insert(Watched {
        deadline: Instant::now() + within,
        socket,
    });
    Slot::try_from(slot).ok()
}

/// The connection in `slot` validated or ended: stop watching it.
pub fn release(slot: Slot) {
    let mut watched = watched();
    if watched.contains(slot as usize) {
        watched.remove(slot as usize);
    }
}

async fn sweep() {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let now = Instant::now();
        let mut watched = watched();
        let late: Vec<usize> = watched
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(slot, _)| slot)
            .collect();
        for slot in late {
            let gone = watched.remove(slot);
            let _ = gone.socket.shutdown(std::net::Shutdown::Both);
            if let Some(suppressed) = CLOSED_LOG.admit() {
                tracing::warn!(
                    suppressed,
                    "closing a connection that sent no VALIDATE in time"
                );
            }
        }
    }
}
