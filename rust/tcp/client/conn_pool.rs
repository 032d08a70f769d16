//! The connections of one [`crate::tcp::TcpStore`]: idle clients, checked out one per call.
//!
//! torch's client has one connection per store object, held for a whole call, so a `wait` in
//! one thread blocks every other thread's `set` on the same store until it ends (measured: a
//! `set` waited 1.9 s behind a 2 s `wait`). Here a call takes an idle connection, or opens one
//! when all are busy, and gives it back after, so calls from several threads run side by side.
//! The most recently returned connection is taken first: a single-threaded caller keeps using
//! one connection, which lets a wait that timed out resume on it without being sent again.
//!
//! After `fork` the child must not talk over the parent's sockets (two processes reading one
//! stream would each see half the replies): the pool remembers the pid that opened its
//! connections and, in any other process, forgets them without a word on the wire and connects
//! afresh.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::Client;
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::auth::AuthToken;

/// Idle connections kept open beyond the one in use; more are closed when given back.
const MAX_IDLE: usize = 4;

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
            idle: Mutex::new(Idle {
                pid: std::process::id(),
                clients: first.into_iter().collect(),
            }),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
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
        let client = Client::connect_until(&self.host, self.port, deadline, token)?;
        if !client.is_durable_server() {
            // Another server took the address: back to failing at once.
            self.durable.store(false, Ordering::Relaxed);
        }
        Ok(client)
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
    pub fn checkin(&self, client: Client) {
        if client.is_durable_server() {
            self.durable.store(true, Ordering::Relaxed);
        }
        let mut idle = self.idle();
        if !client.is_broken() && idle.pid == std::process::id() && idle.clients.len() < MAX_IDLE {
            idle.clients.push(client);
        }
    }
}
