//! The connections of one [`crate::tcp::TcpStore`]: idle clients, checked out one per call.
//!
//! torch's client has one connection per store object, held for a whole call, so a `wait` in
//! one thread blocks every other thread's `set` on the same store until it ends (measured: a
//! `set` waited 1.9 s behind a 2 s `wait`). Here a call takes an idle connection, or opens one
//! when all are busy, and gives it back after, so calls from several threads run side by side.
//! The most recently returned connection is taken first: a single-threaded caller keeps using
//! one connection, which lets a wait that timed out resume on it without being sent again.
//!
//! A server whose state outlives it (the handshake says so: `--backend etcd://...`) may be
//! restarted under a store: then a call's new connection is retried until that call's deadline,
//! on one backoff schedule per pool (`Backoff`), shared by every thread and every call, and
//! kept across calls: a caller that waits in short slices (Python, to notice Ctrl-C), or a
//! server that accepts and dies again at once, cannot turn the retries into a loop of connects.
//! Only a call that succeeds (or a slice of a wait that times out on a live connection) resets
//! it. Against an in-memory server a broken connection gets one new attempt: its keys are gone.
//!
//! After `fork` the child must not talk over the parent's sockets (two processes reading one
//! stream would each see half the replies): the pool remembers the pid that opened its
//! connections and, in any other process, forgets them without a word on the wire and connects
//! afresh.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::connect::jitter;
use super::Client;
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::auth::AuthToken;

/// Idle connections kept open beyond the one in use; more are closed when given back.
const MAX_IDLE: usize = 4;

/// Pause after the first failed reconnect to a durable server (or a connection lost to it).
const RECONNECT_START: Duration = Duration::from_millis(100);
/// Longest pause between reconnects: a restarted server is found within about this long of
/// coming back (torch's 60 s cap would leave a waiter asleep long after the restart), and a
/// few thousand ranks knocking every 2 s (with jitter) is a light load for its accept loop.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// When the next reconnect to a durable server may be tried, and the pause after it.
#[derive(Debug)]
struct Backoff {
    /// `None`: at once (no failure since the last call that succeeded).
    next_at: Option<Instant>,
    pause: Duration,
    /// Failures since the last success, for the error message.
    failures: u32,
}

impl Backoff {
    const FRESH: Backoff = Backoff {
        next_at: None,
        pause: RECONNECT_START,
        failures: 0,
    };

    /// A failed attempt, or a lost connection: the next try waits one (jittered) pause more.
    fn failed(&mut self) {
        let after = Instant::now() + self.pause.mul_f64(jitter());
        self.next_at = Some(self.next_at.map_or(after, |at| at.max(after)));
        self.pause = self.pause.mul_f64(1.5).min(RECONNECT_MAX);
        self.failures += 1;
    }
}

/// Idle connections to one server.
pub struct ConnPool {
    host: String,
    port: u16,
    /// Proven to a server that asks for it.
    token: Option<AuthToken>,
    /// A connection of this pool met a durable server (its state outlives it): a connection
    /// that breaks is then replaced by retrying until the call's deadline (the server may be
    /// restarting), not by one attempt.
    durable: AtomicBool,
    /// The reconnect schedule to a durable server.
    backoff: Mutex<Backoff>,
    /// Set while `backoff` is not fresh: a call that succeeds resets it, and only then pays
    /// for the lock.
    backing_off: AtomicBool,
    idle: Mutex<Idle>,
}

struct Idle {
    /// The process that opened `clients`.
    pid: u32,
    clients: Vec<Client>,
}

impl ConnPool {
    /// A pool for `host:port`, starting with `first` (already connected) when given; new
    /// connections prove `token` to a server that asks for it.
    pub fn new(host: &str, port: u16, token: Option<AuthToken>, first: Option<Client>) -> ConnPool {
        let durable = first.as_ref().is_some_and(Client::is_durable_server);
        ConnPool {
            host: host.to_owned(),
            port,
            token,
            durable: AtomicBool::new(durable),
            backoff: Mutex::new(Backoff::FRESH),
            backing_off: AtomicBool::new(false),
            idle: Mutex::new(Idle {
                pid: std::process::id(),
                clients: first.into_iter().collect(),
            }),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True once a connection of this pool met a server whose state outlives it (and no
    /// server without that took its address since).
    pub fn is_durable(&self) -> bool {
        self.durable.load(Ordering::Relaxed)
    }

    /// A connection to a durable server was lost midway through a call: the next reconnect
    /// waits its turn, so a server that accepts and dies again is not hammered.
    pub fn lost_connection(&self) {
        self.failed();
    }

    fn failed(&self) {
        self.backing_off.store(true, Ordering::Relaxed);
        self.backoff().failed();
    }

    /// An idle, healthy connection of this process, or a new one by `deadline` (one attempt,
    /// or attempts until then once the server has said it is durable).
    pub fn checkout(&self, deadline: Deadline) -> Result<Client> {
        {
            let mut idle = self.idle();
            let pid = std::process::id();
            if idle.pid != pid {
                // A forked child: the parent still owns these sockets. Forgetting them leaks
                // only this process's descriptors and sends nothing on the parent's streams.
                for inherited in idle.clients.drain(..) {
                    std::mem::forget(inherited);
                }
                idle.pid = pid;
            }
            // A durable server may have been restarted since the last call: a connection to
            // the old process is left for a new one (a peek per call, for those servers only),
            // so the call goes to the new process instead of failing on the old socket.
            let durable = self.durable.load(Ordering::Relaxed);
            while let Some(mut client) = idle.clients.pop() {
                // The answer to a connection's marker, when it was late for the handshake, may be
                // waiting: it says whether the server is durable before this call needs to know.
                let introduced = client.take_arrived_introduction();
                let durable = durable || client.is_durable_server();
                if durable {
                    self.durable.store(true, Ordering::Relaxed);
                }
                match introduced {
                    Err(err @ Error::Unauthenticated(_)) => return Err(err),
                    Err(_) => continue, // the connection broke: a new one below
                    Ok(()) => {}
                }
                let stale = client.is_broken() || (durable && client.server_left());
                if !stale {
                    return Ok(client);
                }
            }
        }
        let token = self.token.as_ref();
        if !self.durable.load(Ordering::Relaxed) {
            return Client::connect_once_with_token(&self.host, self.port, deadline, token);
        }
        let client = self.reconnect(deadline)?;
        if !client.is_durable_server() {
            // Another server took the address: back to failing at once.
            self.durable.store(false, Ordering::Relaxed);
        }
        Ok(client)
    }

    /// A new connection to a durable server (it may be restarting) by `deadline`, tried on the
    /// pool's [`Backoff`] schedule. When the deadline comes first, this returns there (never
    /// early: a caller that waits in slices would otherwise loop) with
    /// [`Error::NetworkTimeout`] naming the server and the last failure.
    fn reconnect(&self, deadline: Deadline) -> Result<Client> {
        let mut last: Option<Error> = None;
        loop {
            let turn = self.backoff().next_at;
            if let Some(turn) = turn {
                let now = Instant::now();
                match deadline.at() {
                    Some(end) if end <= turn => {
                        std::thread::sleep(end.saturating_duration_since(now));
                        return Err(self.unreachable(last));
                    }
                    _ => std::thread::sleep(turn.saturating_duration_since(now)),
                }
            }
            let token = self.token.as_ref();
            match Client::connect_once_with_token(&self.host, self.port, deadline, token) {
                Ok(client) => return Ok(client),
                // The server answered, and said no: trying again cannot change its mind.
                Err(err @ Error::Unauthenticated(_)) => return Err(err),
                Err(err) => last = Some(err),
            }
            self.failed();
            if deadline.expired() {
                return Err(self.unreachable(last));
            }
        }
    }

    /// Why a reconnect gave up at its deadline (a wait in slices has the slice's, so no
    /// figure here: the caller's own error says how long it waited).
    fn unreachable(&self, last: Option<Error>) -> Error {
        let failures = self.backoff().failures;
        let last = last.map_or_else(String::new, |err| format!("; last: {err}"));
        Error::NetworkTimeout(format!(
            "the store at {}:{} (its state outlives it) could not be reached again by the \
             deadline: {failures} failures since it last answered{last}",
            self.host, self.port,
        ))
    }

    /// torch's description of the connection the next call would take (the most recently
    /// returned one), or `None` when none is idle.
    pub fn describe_idle(&self) -> Option<String> {
        let idle = self.idle();
        if idle.pid != std::process::id() {
            return None;
        }
        idle.clients.last().map(Client::describe)
    }

    /// The token new connections prove.
    pub fn token(&self) -> Option<&AuthToken> {
        self.token.as_ref()
    }

    /// Gives a connection back after a call; a broken one, or one beyond `MAX_IDLE`, is closed.
    /// A healthy one proves the server reachable: the reconnect schedule starts afresh.
    pub fn checkin(&self, client: Client) {
        if client.is_durable_server() {
            self.durable.store(true, Ordering::Relaxed);
        }
        let healthy = !client.is_broken();
        if healthy
            && self.backing_off.load(Ordering::Relaxed)
            && self.backing_off.swap(false, Ordering::Relaxed)
        {
            *self.backoff() = Backoff::FRESH;
        }
        let mut idle = self.idle();
        if healthy && idle.pid == std::process::id() && idle.clients.len() < MAX_IDLE {
            idle.clients.push(client);
        }
    }
}
