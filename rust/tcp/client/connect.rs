//! Connecting: resolve the host, try each address, hand the socket to the handshake, and retry
//! the whole with torch's backoff until the deadline.
//!
//! Kept apart from the handshake because the retry policy (which failures are worth another
//! attempt, how long to sleep, which error to report at the end) is a concern of its own; an
//! attempt itself is [`Client::connect_once_with_token`].

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::no_ping;
use super::socket::ClientSocket;
use super::Client;
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::auth::AuthToken;

/// First reconnect delay, as torch's client.
const BACKOFF_START: Duration = Duration::from_millis(500);

/// Longest reconnect delay, as torch's client.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Time kept back from the last backoff sleep so that one more attempt runs before the deadline.
const FINAL_ATTEMPT_RESERVE: Duration = Duration::from_millis(20);

/// Shortest pause between attempts, so the last moments before a deadline do not spin.
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(5);

/// What a server that closes the connection on PING but answers without it is.
const WITHOUT_PING: &str = "it is a torch server without PING, torch < 2.5";

/// A pseudo-random factor in [0.5, 1.5) for backoff jitter (no RNG dependency needed).
pub(super) fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed =
        (u64::from(nanos) ^ u64::from(std::process::id())).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    0.5 + (mixed >> 11) as f64 / (1u64 << 53) as f64
}

/// Of two failed connect attempts' errors, the one that says more: an attempt cut short by the
/// deadline (it ran with little or no time left) does not hide why the attempts before it
/// failed (a refused connection, say).
fn more_telling(earlier: Option<Error>, latest: Error) -> Error {
    match earlier {
        Some(earlier)
            if matches!(latest, Error::NetworkTimeout(_))
                && !matches!(earlier, Error::NetworkTimeout(_)) =>
        {
            earlier
        }
        _ => latest,
    }
}

/// Resolves `host` forward only, within `deadline`. An IP literal needs no lookup; a name is
/// looked up on a helper thread, so a resolver that never answers cannot outlast the deadline
/// (the thread is left to finish on its own).
fn resolve(host: &str, port: u16, deadline: Deadline) -> Result<Vec<SocketAddr>> {
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_owned();
    std::thread::Builder::new()
        .name("ferrodist-resolve".into())
        .spawn(move || {
            let found = (name.as_str(), port)
                .to_socket_addrs()
                .map(|addrs| addrs.collect::<Vec<_>>());
            let _ = tx.send(found);
        })?;
    let found = match deadline.remaining() {
        None => rx.recv().ok(),
        Some(left) => rx.recv_timeout(left).ok(),
    };
    match found {
        Some(Ok(addrs)) => Ok(addrs),
        Some(Err(e)) => Err(Error::Network(format!("resolving {host}: {e}"))),
        None => Err(Error::NetworkTimeout(format!("resolving {host} timed out"))),
    }
}

impl Client {
    /// Connects and handshakes, retrying with backoff until `timeout` (zero: forever) passes.
    ///
    /// The last sleep is cut short to the deadline and one more attempt is made there, so a
    /// server that starts late in the window is still found; the error says how long the
    /// attempts really went on and how many there were.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Client> {
        Client::connect_with_token(host, port, timeout, None)
    }

    /// [`Client::connect`], proving `token` to a server that asks for one.
    pub fn connect_with_token(
        host: &str,
        port: u16,
        timeout: Duration,
        token: Option<&AuthToken>,
    ) -> Result<Client> {
        Client::connect_until(host, port, Deadline::after(timeout), token)
    }

    /// [`Client::connect_with_token`] until `deadline` passes.
    pub fn connect_until(
        host: &str,
        port: u16,
        deadline: Deadline,
        token: Option<&AuthToken>,
    ) -> Result<Client> {
        let started = Instant::now();
        let mut interval = BACKOFF_START;
        let mut attempts = 0u32;
        let mut last: Option<Error> = None;
        loop {
            attempts += 1;
            match Client::connect_once_with_token(host, port, deadline, token) {
                Ok(client) => return Ok(client),
                // The server answered, and said no: trying again cannot change its mind.
                Err(err @ Error::Unauthenticated(_)) => return Err(err),
                Err(err) => last = Some(more_telling(last, err)),
            }
            let last = last.as_ref().expect("an attempt failed");
            let delay = interval.mul_f64(jitter());
            interval = interval.mul_f64(1.5).min(BACKOFF_MAX);
            match deadline.remaining() {
                Some(left) if left.is_zero() => {
                    tracing::debug!(%last, attempts, "giving up connecting");
                    return Err(Error::NetworkTimeout(format!(
                        "The client socket has timed out after {}ms while trying to connect \
                         to ({host}, {port}): {attempts} attempts over {}ms. Cause: {last}",
                        deadline.timeout().as_millis(),
                        started.elapsed().as_millis()
                    )));
                }
                Some(left) => std::thread::sleep(
                    delay
                        .min(left.saturating_sub(FINAL_ATTEMPT_RESERVE))
                        .max(MIN_RETRY_PAUSE.min(left)),
                ),
                None => std::thread::sleep(delay),
            }
        }
    }

    /// One attempt: resolve, connect to each address in turn, handshake. No retry.
    pub fn connect_once(host: &str, port: u16, deadline: Deadline) -> Result<Client> {
        Client::connect_once_with_token(host, port, deadline, None)
    }

    /// [`Client::connect_once`], proving `token` to a server that asks for one.
    pub fn connect_once_with_token(
        host: &str,
        port: u16,
        deadline: Deadline,
        token: Option<&AuthToken>,
    ) -> Result<Client> {
        let mut last = Error::Network(format!("{host} resolved to no address"));
        for addr in resolve(host, port, deadline)? {
            let io = |e: std::io::Error| Error::Network(format!("connecting to {addr}: {e}"));
            let stream = match deadline.remaining() {
                Some(left) if left.is_zero() => {
                    return Err(Error::NetworkTimeout(format!(
                        "connecting to {addr} timed out"
                    )))
                }
                Some(left) => TcpStream::connect_timeout(&addr, left),
                None => TcpStream::connect(addr),
            };
            let attempt = stream
                .and_then(|s| ClientSocket::new(s, deadline.timeout()))
                .map_err(io)
                .and_then(|socket| {
                    let peer = format!("{host}:{port}");
                    Client::handshake(socket, peer, deadline, token)
                })
                // A torch 2.4 server closes the connection on PING: once more without it. Such
                // a server can never prove a token, so a client holding one only learns from
                // that what it is, and refuses it at once instead of retrying into its timeout.
                .or_else(|e| {
                    let plain = no_ping::without_ping(e, addr, format!("{host}:{port}"), deadline);
                    match (plain, token) {
                        (Ok(server), Some(_)) => Err(server.unproven(WITHOUT_PING)),
                        (plain, _) => plain,
                    }
                });
            match attempt {
                Ok(client) => return Ok(client),
                Err(err) => last = err,
            }
        }
        Err(last)
    }
}
