//! The TCPStore client: one blocking connection to a torch or ferrodist server, driven by the
//! calling thread (see [`ClientSocket`] for why blocking, and for its opt-in polling).
//!
//! It speaks raw wire keys (callers add torch's `/` prefix; see [`super::store`]) and follows the
//! stock client's sequences, so any torch >= 2.4 server accepts it:
//!
//! * **Connect** resolves the host forward only (no reverse lookup), tries every address, and
//!   retries refused/reset/unreachable connects and failed handshakes with torch's backoff
//!   (500 ms, x1.5, +-50 % jitter, at most 60 s) until the deadline.
//! * **Handshake**: torch's VALIDATE and PING (with the process id as nonce, as torch's
//!   client), then [`FERRODIST_PING`], a second PING by which the client says that it is
//!   ferrodist's, all in one write and one round trip. ferrodist's server answers the marker
//!   with [`FERRODIST_PONG`] (and from then on treats the connection as a ferrodist client);
//!   any other server echoes it. Every server sends that answer right behind the echo of the
//!   pid, so it costs no wait; a peer that answers torch's handshake and nothing more (a test
//!   that reads it off the wire and closes, say) does not fail the connect: the answer is then
//!   looked for when the connection is next used. A ferrodist server that requires a token
//!   answers the marker with a challenge, which the client answers with a proof that it holds
//!   the token ([`crate::tcp::auth`]); without a token, or with a wrong one, the connect fails
//!   at once with [`Error::Unauthenticated`] (never retried into a timeout).
//! * **Waits** follow torch's CANCEL_WAIT exchange, with two refinements. Against ferrodist's
//!   server, a GET or MULTI_GET is sent in the same write as its WAIT (the server holds it until
//!   the wait is released), so `get` costs one round trip instead of two. And a wait that times
//!   out stays registered: calling it again with the same keys resumes it without resending,
//!   and any other request first cancels it. That lets a caller wait in short slices (to notice
//!   Ctrl-C) without a WAIT/CANCEL_WAIT pair per slice.
//!
//! Every call takes a [`Deadline`]. A call that passes it midway fails with a network error and
//! leaves the client broken ([`Client::is_broken`]): the next call fails fast with
//! [`Error::ConnectionClosed`], so the owner reconnects instead of reading a stale reply. A wait
//! that passes its own (shorter) timeout is not broken; see [`Client::wait_then`].

//!
//! # Files
//!
//! * `mod.rs`: the [`Client`] and its protocol sequences; `socket.rs`: its socket, read by the
//!   calling thread with a deadline; `no_ping.rs`: the handshake for torch 2.4's servers,
//!   which have no PING; `conn_pool.rs`: a store's connections, one per concurrent call.

pub mod conn_pool;
pub mod socket;

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use self::socket::{ClientSocket, Filled};
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::auth::{
    self, AuthToken, Challenges, Side, ADMITTED, ADMITTED_DURABLE, CHALLENGE_LEN,
    FERRODIST_PONG_AUTH, FERRODIST_PONG_AUTH_V1, PROOF_LEN, REFUSED, TOKEN_ENV, TOKEN_FILE_ENV,
};
use crate::tcp::codec::{
    decode_reply, scan_request, Limits, Reply, ReplyKind, Request, FERRODIST_PING, FERRODIST_PONG,
    FERRODIST_PONG_DURABLE, NOT_READY, READY, STOP_WAITING, VALIDATE_MAGIC, WAIT_CANCELED,
};

mod no_ping;

/// First reconnect delay, as torch's client.
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest reconnect delay, as torch's client.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Time kept back from the last backoff sleep so that one more attempt runs before the deadline.
const FINAL_ATTEMPT_RESERVE: Duration = Duration::from_millis(20);
/// Shortest pause between attempts, so the last moments before a deadline do not spin.
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(5);

/// How long a connect waits for the answer to the marker PING after the echo of the pid.
const INTRODUCTION_GRACE: Duration = Duration::from_millis(100);

/// Fire-and-forget requests check for a closed connection at most this often.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(1);

/// torch's message when a server closes the connection.
/// What a server that closes the connection on PING but answers without it is.
const WITHOUT_PING: &str = "it is a torch server without PING, torch < 2.5";

const CLOSED_BY_SERVER: &str = "Failed to recv, got 0 bytes. Connection was likely closed. \
                                Did the remote server shutdown or crash?";

/// A wait whose STOP_WAITING has not been read yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PendingWait {
    keys: Vec<Bytes>,
    /// A request sent in the same write, held by ferrodist's server until the wait ends.
    follow: Option<Request>,
}

/// Where the client stands in telling the server that it is ferrodist's ([`FERRODIST_PING`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Introduction {
    /// Sent: its answer is the next reply on the wire, read before the next call's own.
    Unanswered,
    /// Answered, or not to be sent (a server without PING).
    Done,
}

/// One connection to a store server.
pub struct Client {
    socket: ClientSocket,
    peer: String,
    /// The deadline of the call in progress.
    deadline: Deadline,
    /// When the connection was last seen alive (a reply read, or an EOF check passed).
    peer_checked: Instant,
    input: BytesMut,
    output: BytesMut,
    ferrodist_server: bool,
    /// The server said its state outlives it (see [`FERRODIST_PONG_DURABLE`]).
    durable_server: bool,
    introduction: Introduction,
    pending: Option<PendingWait>,
    busy: bool,
}

fn closed(peer: &str, reason: impl Into<String>) -> Error {
    Error::ConnectionClosed {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

/// A pseudo-random factor in [0.5, 1.5) for backoff jitter (no RNG dependency needed).
fn jitter() -> f64 {
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

/// The earlier of two optional instants (`None` is "never").
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
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

    /// A client on a connected socket that has not shaken hands yet.
    fn unshaken(socket: ClientSocket, peer: String, deadline: Deadline) -> Client {
        Client {
            socket,
            peer,
            deadline,
            peer_checked: Instant::now(),
            input: BytesMut::with_capacity(4096),
            output: BytesMut::with_capacity(4096),
            ferrodist_server: false,
            durable_server: false,
            introduction: Introduction::Done,
            pending: None,
            busy: false,
        }
    }

    fn handshake(
        socket: ClientSocket,
        peer: String,
        deadline: Deadline,
        token: Option<&AuthToken>,
    ) -> Result<Client> {
        let mut client = Client::unshaken(socket, peer, deadline);
        let pid = std::process::id();
        Request::Validate {
            magic: VALIDATE_MAGIC,
        }
        .encode(&mut client.output);
        Request::Ping { nonce: pid }.encode(&mut client.output);
        Request::Ping {
            nonce: FERRODIST_PING,
        }
        .encode(&mut client.output);
        client.flush()?;
        match client.read_reply(ReplyKind::Nonce)? {
            Reply::Nonce(echo) if echo == pid => {}
            other => {
                return Err(Error::Network(format!(
                    "Ping failed, invalid value returned from server. Expected: {pid}, Got: \
                     {other:?}"
                )))
            }
        }
        client.introduction = Introduction::Unanswered;
        if token.is_some() {
            // Nothing may go out before the server has seen the proof.
            client.read_introduction(token)?;
        } else {
            client.await_introduction()?;
        }
        Ok(client)
    }

    /// Reads the marker's answer when it comes within [`INTRODUCTION_GRACE`]. Every server
    /// sends it right behind the echo of the pid; a peer that answered torch's handshake and
    /// nothing more (one that closed, say) leaves it unanswered, to be read (or its absence
    /// found) at the next call, rather than failing or delaying the connect.
    fn await_introduction(&mut self) -> Result<()> {
        let until = Instant::now() + INTRODUCTION_GRACE;
        let until = earliest(Some(until), self.deadline.at());
        while self.input.len() < 4 {
            match self.socket.fill(&mut self.input, until) {
                Ok(Filled::Data) => {}
                Ok(Filled::Eof | Filled::TimedOut) | Err(_) => return Ok(()),
            }
        }
        self.read_introduction(None)
    }

    /// Reads the marker's answer if it has arrived, without waiting for it: what the server is
    /// may then be known before a call (a durable server's restart, say) needs it.
    pub fn take_arrived_introduction(&mut self) -> Result<()> {
        if self.introduction != Introduction::Unanswered {
            return Ok(());
        }
        let mut broken = None;
        if self.input.len() < 4 {
            match self.socket.fill_now(&mut self.input) {
                Ok(Filled::Data | Filled::TimedOut) => {}
                Ok(Filled::Eof) => broken = Some(closed(&self.peer, CLOSED_BY_SERVER)),
                Err(e) => broken = Some(closed(&self.peer, format!("connection broken: {e}"))),
            }
        }
        // An answer that came before the server left still says what the server was.
        if self.input.len() >= 4 {
            self.read_introduction(None)?;
        }
        broken.map_or(Ok(()), Err)
    }

    /// Waits, until `deadline`, for the answer to the marker PING when it was late for the
    /// handshake: what the server is (durable, say) is then known before a request goes out.
    /// A deadline passed midway leaves the client broken.
    pub fn await_introduced(&mut self, deadline: Deadline) -> Result<()> {
        if self.introduction != Introduction::Unanswered {
            return Ok(());
        }
        self.begin(deadline)?;
        self.read_introduction(None)?;
        self.busy = false;
        Ok(())
    }

    /// Reads the server's answer to the marker PING (the next reply on the wire) and learns
    /// from it what the server is; `token` answers a challenge.
    fn read_introduction(&mut self, token: Option<&AuthToken>) -> Result<()> {
        self.introduction = Introduction::Done;
        let answer = self.read_reply(ReplyKind::Nonce)?;
        if let Reply::Nonce(FERRODIST_PONG_AUTH) = answer {
            self.ferrodist_server = true;
            self.durable_server = self.authenticate(token)?;
            return Ok(());
        }
        if token.is_some() {
            // A client with a token talks only to a server that proves it holds the token.
            return Err(self.unproven_server(&answer));
        }
        match answer {
            Reply::Nonce(FERRODIST_PONG) => self.ferrodist_server = true,
            Reply::Nonce(FERRODIST_PONG_DURABLE) => {
                self.ferrodist_server = true;
                self.durable_server = true;
            }
            Reply::Nonce(FERRODIST_PING) => {}
            Reply::Nonce(FERRODIST_PONG_AUTH_V1) => return Err(self.no_token()),
            other => {
                return Err(Error::Network(format!(
                    "Ping failed, invalid value returned from server. Expected: \
                     {FERRODIST_PING}, Got: {other:?}"
                )))
            }
        }
        Ok(())
    }

    /// Why a client with a token will not use a server that did not prove the token (the
    /// marker's `answer` says what the server is).
    fn unproven_server(&self, answer: &Reply) -> Error {
        self.unproven(match answer {
            Reply::Nonce(FERRODIST_PONG | FERRODIST_PONG_DURABLE) => {
                "it is a ferrodist server that requires no token"
            }
            Reply::Nonce(FERRODIST_PONG_AUTH_V1) => {
                "it runs an older ferrodist-store whose authentication does not prove the \
                 server; upgrade it"
            }
            Reply::Nonce(FERRODIST_PING) => "it is not ferrodist's (a torch server?)",
            _ => "it does not speak ferrodist's handshake",
        })
    }

    /// [`Client::unproven_server`], with `what` the server turned out to be.
    fn unproven(&self, what: &str) -> Error {
        Error::Unauthenticated(format!(
            "the store at {} did not prove that it holds this client's auth token ({what}); \
             a client with a token sends nothing to such a server (drop the token, e.g. unset \
             {TOKEN_ENV}, to use it without authentication)",
            self.peer
        ))
    }

    fn no_token(&self) -> Error {
        Error::Unauthenticated(format!(
            "the store at {} requires an auth token and this client has none: pass \
             auth_token= to TCPStore, or set {TOKEN_ENV} (or {TOKEN_FILE_ENV})",
            self.peer
        ))
    }

    /// Answers the server's challenge with the proof that this client holds `token` and its own
    /// challenge, then checks the server's proof; true when the server that admitted it is
    /// durable.
    fn authenticate(&mut self, token: Option<&AuthToken>) -> Result<bool> {
        let server_challenge = self.read_raw(CHALLENGE_LEN)?;
        let Some(token) = token else {
            return Err(self.no_token());
        };
        let client_challenge = auth::challenge()?;
        let challenges = Challenges {
            server: &server_challenge,
            client: &client_challenge,
        };
        self.output
            .extend_from_slice(&token.prove(Side::Client, challenges));
        self.output.extend_from_slice(&client_challenge);
        self.flush()?;
        let durable = match self.read_raw(1).map(|answer| answer[0]) {
            Ok(ADMITTED) => false,
            Ok(ADMITTED_DURABLE) => true,
            Ok(REFUSED) | Err(Error::ConnectionClosed { .. }) => {
                return Err(Error::Unauthenticated(format!(
                    "authentication failed: the store at {} refused this client's auth token \
                     (the server holds a different one)",
                    self.peer
                )))
            }
            Ok(other) => {
                return Err(Error::Protocol(format!(
                    "unexpected answer {other} to the auth proof"
                )))
            }
            Err(err) => return Err(err),
        };
        let server_proof = self.read_raw(PROOF_LEN)?;
        if !token.verify(Side::Server, challenges, &server_proof) {
            return Err(Error::Unauthenticated(format!(
                "authentication failed: the store at {} admitted this client but could not \
                 prove that it holds the same auth token (an impostor?); nothing was sent to it",
                self.peer
            )));
        }
        Ok(durable)
    }

    /// Reads `n` raw bytes (the auth exchange, which is outside torch's reply framing).
    fn read_raw(&mut self, n: usize) -> Result<BytesMut> {
        while self.input.len() < n {
            match self.socket.fill(&mut self.input, self.deadline.at()) {
                Ok(Filled::Data) => self.peer_checked = Instant::now(),
                Ok(Filled::Eof) => return Err(closed(&self.peer, CLOSED_BY_SERVER)),
                Ok(Filled::TimedOut) => return Err(self.passed_deadline()),
                Err(e) => return Err(closed(&self.peer, format!("recv failed: {e}"))),
            }
        }
        Ok(self.input.split_to(n))
    }

    /// torch's description of this connection's socket (see [`ClientSocket::describe`]).
    pub fn describe(&self) -> String {
        self.socket.describe()
    }

    /// `host:port` this client talks to.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// True when the server is ferrodist's (it answered the handshake's PING with [`FERRODIST_PONG`]).
    pub fn is_ferrodist_server(&self) -> bool {
        self.ferrodist_server
    }

    /// True when the server's state outlives it (it answered [`FERRODIST_PONG_DURABLE`]).
    pub fn is_durable_server(&self) -> bool {
        self.durable_server
    }

    /// True when the server has closed this idle connection (it was stopped or killed since
    /// the last call): one `recv` peek, nothing consumed.
    pub fn server_left(&self) -> bool {
        self.input.is_empty() && self.socket.peer_closed().unwrap_or(true)
    }

    /// True when an earlier call was abandoned midway; the connection must be replaced.
    pub fn is_broken(&self) -> bool {
        self.busy
    }

    fn passed_deadline(&self) -> Error {
        Error::NetworkTimeout(format!(
            "no reply from the store at {} within {}ms",
            self.peer,
            self.deadline.timeout().as_millis()
        ))
    }

    fn flush(&mut self) -> Result<()> {
        // A server that died since the last call has left an EOF to read. Without this check a
        // fire-and-forget request (SET) would "succeed" into the void; a request with a reply
        // finds the EOF when it reads. Checked at most once per PEER_CHECK_EVERY: an EOF that
        // recent may not have arrived yet anyway, and a burst of SETs pays one check, not one
        // syscall each.
        let now = Instant::now();
        let due = now.duration_since(self.peer_checked) >= PEER_CHECK_EVERY;
        if due {
            // The marker's answer, unread after fire-and-forget requests, would hide an EOF.
            self.take_arrived_introduction()?;
        }
        if self.input.is_empty() && due {
            self.peer_checked = now;
            match self.socket.peer_closed() {
                Ok(false) => {}
                Ok(true) => return Err(closed(&self.peer, CLOSED_BY_SERVER)),
                Err(e) => return Err(closed(&self.peer, format!("connection broken: {e}"))),
            }
        }
        let result = self.socket.send_all(&self.output, self.deadline.at());
        self.output.clear();
        match result {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                Err(self.passed_deadline())
            }
            Err(e) => Err(closed(&self.peer, format!("send failed: {e}"))),
        }
    }

    /// Reads one reply, giving up at `until` (the earlier of it and the call's deadline):
    /// `Ok(None)` when `until` came first, an error when the call's deadline did.
    fn read_reply_until(
        &mut self,
        kind: ReplyKind,
        until: Option<Instant>,
    ) -> Result<Option<Reply>> {
        if self.introduction == Introduction::Unanswered {
            // No token: a server that asks for one is refused here, at the first reply.
            self.read_introduction(None)?;
        }
        let limit = earliest(until, self.deadline.at());
        loop {
            if let Some(reply) = decode_reply(kind, &mut self.input, &Limits::UNLIMITED)? {
                return Ok(Some(reply));
            }
            match self.socket.fill(&mut self.input, limit) {
                // A reply proves the server was alive just now: no EOF check needed yet.
                Ok(Filled::Data) => self.peer_checked = Instant::now(),
                Ok(Filled::Eof) => return Err(closed(&self.peer, CLOSED_BY_SERVER)),
                Ok(Filled::TimedOut) if self.deadline.expired() => {
                    return Err(self.passed_deadline())
                }
                // Only a wait's own timeout ends a read between replies; a reply cut short
                // leaves bytes behind, which the next call must not misread.
                Ok(Filled::TimedOut) if self.input.is_empty() => return Ok(None),
                Ok(Filled::TimedOut) => return Err(self.passed_deadline()),
                Err(e) => return Err(closed(&self.peer, format!("recv failed: {e}"))),
            }
        }
    }

    fn read_reply(&mut self, kind: ReplyKind) -> Result<Reply> {
        match self.read_reply_until(kind, None)? {
            Some(reply) => Ok(reply),
            None => Err(self.passed_deadline()),
        }
    }

    fn read_byte(&mut self) -> Result<u8> {
        self.read_byte_until(None)?
            .ok_or_else(|| self.passed_deadline())
    }

    fn read_byte_until(&mut self, until: Option<Instant>) -> Result<Option<u8>> {
        match self.read_reply_until(ReplyKind::Byte, until)? {
            None => Ok(None),
            Some(Reply::Byte(b)) => Ok(Some(b)),
            Some(other) => Err(Error::Protocol(format!(
                "expected a status byte, got {other:?}"
            ))),
        }
    }

    /// Marks the start of a call bounded by `deadline`; fails if an earlier call was abandoned
    /// midway.
    fn begin(&mut self, deadline: Deadline) -> Result<()> {
        if self.busy {
            return Err(closed(
                &self.peer,
                "an earlier request was interrupted midway",
            ));
        }
        self.busy = true;
        self.deadline = deadline;
        Ok(())
    }

    /// Sends one request and reads its reply (`None` for fire-and-forget requests), cancelling
    /// a pending wait first.
    pub fn call(&mut self, deadline: Deadline, request: &Request) -> Result<Option<Reply>> {
        self.begin(deadline)?;
        self.settle()?;
        self.encode_checked(request)?;
        self.flush()?;
        let reply = match request.reply_kind() {
            Some(kind) => Some(self.read_reply(kind)?),
            None => None,
        };
        self.busy = false;
        Ok(reply)
    }

    /// Queues `request` for sending, unless it breaks the servers' [`Limits`] (torch's libuv
    /// server and ferrodist's close the connection on such a request, and one with no reply,
    /// such as SET, would be lost silently and break the next call). Then nothing is sent, the
    /// connection stays usable, and the error names the limit.
    fn encode_checked(&mut self, request: &Request) -> Result<()> {
        let start = self.output.len();
        request.encode(&mut self.output);
        if let Err(broken) = scan_request(&self.output[start..], &Limits::default()) {
            self.output.truncate(start);
            self.busy = false;
            return Err(Error::InvalidArgument(format!(
                "{:?} not sent: {broken} (a server closes the connection on it)",
                request.opcode()
            )));
        }
        Ok(())
    }

    /// Cancels a pending wait (torch's CANCEL_WAIT exchange), reading every reply it owed.
    fn settle(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        Request::CancelWait.encode(&mut self.output);
        self.flush()?;
        match self.read_byte()? {
            WAIT_CANCELED => return Ok(()),
            STOP_WAITING => {}
            other => {
                return Err(Error::Protocol(format!(
                    "wait_canceled response is expected, got {other}"
                )))
            }
        }
        if let Some(kind) = pending.follow.as_ref().and_then(Request::reply_kind) {
            self.read_reply(kind)?;
        }
        match self.read_byte()? {
            WAIT_CANCELED => Ok(()),
            other => Err(Error::Protocol(format!(
                "wait_canceled response is expected, got {other}"
            ))),
        }
    }

    /// Waits until every key exists, then sends `follow` (if any) and returns its reply.
    ///
    /// On timeout returns `Ok(Err(()))` with the wait still registered: calling again with the
    /// same keys and follow-up resumes it, anything else cancels it first. `timeout` of `None`
    /// waits forever (within the call's `deadline`).
    pub fn wait_then(
        &mut self,
        deadline: Deadline,
        keys: &[Bytes],
        follow: Option<Request>,
        timeout: Option<Duration>,
    ) -> Result<std::result::Result<Option<Reply>, ()>> {
        let wait_until = timeout.and_then(|t| Instant::now().checked_add(t));
        self.begin(deadline)?;
        let pipeline = self.ferrodist_server && follow.is_some();
        let wanted = PendingWait {
            keys: keys.to_vec(),
            follow: follow.clone().filter(|_| pipeline),
        };
        if self.pending.as_ref() != Some(&wanted) {
            self.settle()?;
            let start = self.output.len();
            let wait = Request::Wait {
                keys: keys.to_vec(),
            };
            let queued = self
                .encode_checked(&wait)
                .and_then(|()| match &wanted.follow {
                    Some(f) => self.encode_checked(f),
                    None => Ok(()),
                });
            if let Err(refused) = queued {
                self.output.truncate(start); // the WAIT too: neither goes out
                return Err(refused);
            }
            self.flush()?;
            self.pending = Some(wanted);
        }
        let Some(stop) = self.read_byte_until(wait_until)? else {
            self.busy = false;
            return Ok(Err(()));
        };
        if stop != STOP_WAITING {
            return Err(Error::Protocol(format!(
                "Stop_waiting response is expected, got {stop}"
            )));
        }
        self.pending = None;
        let reply = match follow {
            Some(f) if pipeline => Some(self.read_reply(f.reply_kind().expect("has a reply"))?),
            Some(f) => {
                f.encode(&mut self.output);
                self.flush()?;
                match f.reply_kind() {
                    Some(kind) => Some(self.read_reply(kind)?),
                    None => None,
                }
            }
            None => None,
        };
        self.busy = false;
        Ok(Ok(reply))
    }

    /// BARRIER: counts this arrival at `key` and waits for `world_size` arrivals. On timeout the
    /// wait is cancelled at once (the arrival stays counted, as on torch) and `Ok(false)` is
    /// returned.
    pub fn barrier(
        &mut self,
        deadline: Deadline,
        key: Bytes,
        world_size: i64,
        timeout: Option<Duration>,
    ) -> Result<bool> {
        let wait_until = timeout.and_then(|t| Instant::now().checked_add(t));
        self.begin(deadline)?;
        self.settle()?;
        self.encode_checked(&Request::Barrier {
            key: key.clone(),
            world_size,
        })?;
        self.flush()?;
        match self.read_byte_until(wait_until)? {
            Some(STOP_WAITING) => {}
            Some(other) => {
                return Err(Error::Protocol(format!(
                    "Stop_waiting response is expected, got {other}"
                )))
            }
            None => {
                self.pending = Some(PendingWait {
                    keys: vec![key],
                    follow: None,
                });
                self.settle()?;
                self.busy = false;
                return Ok(false);
            }
        }
        self.busy = false;
        Ok(true)
    }

    /// CHECK: true iff every key is present.
    pub fn check(&mut self, deadline: Deadline, keys: &[Bytes]) -> Result<bool> {
        let request = Request::Check {
            keys: keys.to_vec(),
        };
        match self.call(deadline, &request)? {
            Some(Reply::Byte(READY)) => Ok(true),
            Some(Reply::Byte(NOT_READY)) => Ok(false),
            other => Err(Error::Protocol(format!(
                "ready or not_ready response expected, got {other:?}"
            ))),
        }
    }

    /// A request whose reply is an `i64` (ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN).
    pub fn call_int(&mut self, deadline: Deadline, request: &Request) -> Result<i64> {
        match self.call(deadline, request)? {
            Some(Reply::Int(n)) => Ok(n),
            other => Err(Error::Protocol(format!(
                "expected an integer reply, got {other:?}"
            ))),
        }
    }

    /// A request whose reply is one value (GET, COMPARE_SET).
    pub fn call_value(&mut self, deadline: Deadline, request: &Request) -> Result<Bytes> {
        match self.call(deadline, request)? {
            Some(Reply::Value(v)) => Ok(v),
            other => Err(Error::Protocol(format!(
                "expected a value reply, got {other:?}"
            ))),
        }
    }
}
