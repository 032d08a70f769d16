//! The async TCPStore client: one connection to a torch or ferrodist server.
//!
//! It speaks raw wire keys (callers add torch's `/` prefix; see [`super::store`]) and follows the
//! stock client's sequences, so any torch >= 2.4 server accepts it:
//!
//! * **Connect** resolves the host forward only (no reverse lookup), tries every address, and
//!   retries refused/reset/unreachable connects and failed handshakes with torch's backoff
//!   (500 ms, x1.5, +-50 % jitter, at most 60 s) until the deadline.
//! * **Handshake**: VALIDATE, PING (echo checked) and a CHECK of [`SERVER_MARKER_KEY`], in one
//!   write and one round trip. Only ferrodist's server says the marker is present; torch's say
//!   "not ready", harmlessly.
//! * **Waits** follow torch's CANCEL_WAIT exchange, with two refinements. Against ferrodist's
//!   server, a GET or MULTI_GET is sent in the same write as its WAIT (the server holds it until
//!   the wait is released), so `get` costs one round trip instead of two. And a wait that times
//!   out stays registered: calling it again with the same keys resumes it without resending,
//!   and any other request first cancels it. That lets a caller wait in short slices (to notice
//!   Ctrl-C) without a WAIT/CANCEL_WAIT pair per slice.
//!
//! Every method is cancellation-safe in the sense that matters: if its future is dropped midway
//! (an outer deadline), the client marks itself broken and the next call fails fast with
//! [`Error::ConnectionClosed`], so the owner reconnects instead of reading a stale reply.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::codec::{
    decode_reply, Limits, Reply, ReplyKind, Request, NOT_READY, READY, SERVER_MARKER_KEY,
    STOP_WAITING, VALIDATE_MAGIC, WAIT_CANCELED,
};
use crate::error::{Error, Result};
use crate::store::Deadline;

/// First reconnect delay, as torch's client.
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest reconnect delay, as torch's client.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// torch's message when a server closes the connection.
const CLOSED_BY_SERVER: &str = "Failed to recv, got 0 bytes. Connection was likely closed. \
                                Did the remote server shutdown or crash?";

/// A wait whose STOP_WAITING has not been read yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PendingWait {
    keys: Vec<Bytes>,
    /// A request sent in the same write, held by ferrodist's server until the wait ends.
    follow: Option<Request>,
}

/// One connection to a store server.
pub struct Client {
    stream: TcpStream,
    peer: String,
    input: BytesMut,
    output: BytesMut,
    ferrodist_server: bool,
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

impl Client {
    /// Connects and handshakes, retrying with backoff until `timeout` (zero: forever) passes.
    pub async fn connect(host: &str, port: u16, timeout: Duration) -> Result<Client> {
        let deadline = Deadline::after(timeout);
        let mut interval = BACKOFF_START;
        loop {
            let last = match Client::connect_once(host, port, deadline).await {
                Ok(client) => return Ok(client),
                Err(err) => err,
            };
            let delay = interval.mul_f64(jitter());
            interval = interval.mul_f64(1.5).min(BACKOFF_MAX);
            match deadline.remaining() {
                Some(left) if left <= delay => {
                    tracing::debug!(%last, "giving up connecting");
                    return Err(Error::Network(format!(
                        "The client socket has timed out after {}ms while trying to connect \
                         to ({host}, {port}). Last error: {last}",
                        deadline.timeout().as_millis()
                    )));
                }
                _ => tokio::time::sleep(delay).await,
            }
        }
    }

    /// One attempt: resolve, connect to each address in turn, handshake. No retry.
    pub async fn connect_once(host: &str, port: u16, deadline: Deadline) -> Result<Client> {
        let within = |left: Option<Duration>| left.unwrap_or(Duration::from_secs(3600));
        let addrs: Vec<SocketAddr> = tokio::time::timeout(
            within(deadline.remaining()),
            tokio::net::lookup_host((host, port)),
        )
        .await
        .map_err(|_| Error::Network(format!("resolving {host} timed out")))?
        .map_err(|e| Error::Network(format!("resolving {host}: {e}")))?
        .collect();
        let mut last = Error::Network(format!("{host} resolved to no address"));
        for addr in addrs {
            let attempt = async {
                let io = |e: std::io::Error| Error::Network(format!("connecting to {addr}: {e}"));
                let stream = TcpStream::connect(addr).await.map_err(io)?;
                stream.set_nodelay(true).map_err(io)?;
                Client::handshake(stream, format!("{host}:{port}")).await
            };
            match tokio::time::timeout(within(deadline.remaining()), attempt).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(err)) => last = err,
                Err(_) => last = Error::Network(format!("connecting to {addr} timed out")),
            }
        }
        Err(last)
    }

    async fn handshake(stream: TcpStream, peer: String) -> Result<Client> {
        let mut client = Client {
            stream,
            peer,
            input: BytesMut::with_capacity(4096),
            output: BytesMut::with_capacity(4096),
            ferrodist_server: false,
            pending: None,
            busy: false,
        };
        let nonce = std::process::id();
        Request::Validate {
            magic: VALIDATE_MAGIC,
        }
        .encode(&mut client.output);
        Request::Ping { nonce }.encode(&mut client.output);
        let marker = Request::Check {
            keys: vec![Bytes::from_static(SERVER_MARKER_KEY)],
        };
        marker.encode(&mut client.output);
        client.flush().await?;
        match client.read_reply(ReplyKind::Nonce).await? {
            Reply::Nonce(echo) if echo == nonce => {}
            other => {
                return Err(Error::Network(format!(
                    "Ping failed, invalid value returned from server. Expected: {nonce}, Got: {other:?}"
                )))
            }
        }
        client.ferrodist_server = client.read_reply(ReplyKind::Byte).await? == Reply::Byte(READY);
        Ok(client)
    }

    /// `host:port` this client talks to.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// True when the server is ferrodist's (it answered the handshake's marker CHECK).
    pub fn is_ferrodist_server(&self) -> bool {
        self.ferrodist_server
    }

    /// True when an earlier call was abandoned midway; the connection must be replaced.
    pub fn is_broken(&self) -> bool {
        self.busy
    }

    async fn flush(&mut self) -> Result<()> {
        // A server that died since the last call has left an EOF to read. Without this check a
        // fire-and-forget request (SET) would "succeed" into the void. It asks the kernel (one
        // non-blocking peek), not tokio's readiness flags: a store's connection is driven only
        // while a call runs (see `caller_driven`), so those flags can be stale.
        if self.input.is_empty() {
            let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
            match socket2::SockRef::from(&self.stream).peek(&mut probe) {
                Ok(0) => return Err(closed(&self.peer, CLOSED_BY_SERVER)),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(closed(&self.peer, format!("connection broken: {e}"))),
            }
        }
        let result = self.stream.write_all(&self.output).await;
        self.output.clear();
        result.map_err(|e| closed(&self.peer, format!("send failed: {e}")))
    }

    async fn read_reply(&mut self, kind: ReplyKind) -> Result<Reply> {
        loop {
            if let Some(reply) = decode_reply(kind, &mut self.input, &Limits::UNLIMITED)? {
                return Ok(reply);
            }
            self.input.reserve(64 * 1024);
            match self.stream.read_buf(&mut self.input).await {
                Ok(0) => return Err(closed(&self.peer, CLOSED_BY_SERVER)),
                Ok(_) => {}
                Err(e) => return Err(closed(&self.peer, format!("recv failed: {e}"))),
            }
        }
    }

    async fn read_byte(&mut self) -> Result<u8> {
        match self.read_reply(ReplyKind::Byte).await? {
            Reply::Byte(b) => Ok(b),
            other => Err(Error::Protocol(format!(
                "expected a status byte, got {other:?}"
            ))),
        }
    }

    /// Marks the start of a call; fails if an earlier call was abandoned midway.
    fn begin(&mut self) -> Result<()> {
        if self.busy {
            return Err(closed(
                &self.peer,
                "an earlier request was interrupted midway",
            ));
        }
        self.busy = true;
        Ok(())
    }

    /// Sends one request and reads its reply (`None` for fire-and-forget requests), cancelling
    /// a pending wait first.
    pub async fn call(&mut self, request: &Request) -> Result<Option<Reply>> {
        self.begin()?;
        self.settle().await?;
        request.encode(&mut self.output);
        self.flush().await?;
        let reply = match request.reply_kind() {
            Some(kind) => Some(self.read_reply(kind).await?),
            None => None,
        };
        self.busy = false;
        Ok(reply)
    }

    /// Cancels a pending wait (torch's CANCEL_WAIT exchange), reading every reply it owed.
    async fn settle(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        Request::CancelWait.encode(&mut self.output);
        self.flush().await?;
        match self.read_byte().await? {
            WAIT_CANCELED => return Ok(()),
            STOP_WAITING => {}
            other => {
                return Err(Error::Protocol(format!(
                    "wait_canceled response is expected, got {other}"
                )))
            }
        }
        if let Some(kind) = pending.follow.as_ref().and_then(Request::reply_kind) {
            self.read_reply(kind).await?;
        }
        match self.read_byte().await? {
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
    /// waits forever.
    pub async fn wait_then(
        &mut self,
        keys: &[Bytes],
        follow: Option<Request>,
        timeout: Option<Duration>,
    ) -> Result<std::result::Result<Option<Reply>, ()>> {
        self.begin()?;
        let pipeline = self.ferrodist_server && follow.is_some();
        let wanted = PendingWait {
            keys: keys.to_vec(),
            follow: follow.clone().filter(|_| pipeline),
        };
        if self.pending.as_ref() != Some(&wanted) {
            self.settle().await?;
            Request::Wait {
                keys: keys.to_vec(),
            }
            .encode(&mut self.output);
            if let Some(f) = &wanted.follow {
                f.encode(&mut self.output);
            }
            self.flush().await?;
            self.pending = Some(wanted);
        }
        let stop = match timeout {
            None => Some(self.read_byte().await?),
            Some(t) => match tokio::time::timeout(t, self.read_byte()).await {
                Ok(byte) => Some(byte?),
                Err(_) => None,
            },
        };
        let Some(stop) = stop else {
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
            Some(f) if pipeline => Some(
                self.read_reply(f.reply_kind().expect("has a reply"))
                    .await?,
            ),
            Some(f) => {
                f.encode(&mut self.output);
                self.flush().await?;
                match f.reply_kind() {
                    Some(kind) => Some(self.read_reply(kind).await?),
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
    pub async fn barrier(
        &mut self,
        key: Bytes,
        world_size: i64,
        timeout: Option<Duration>,
    ) -> Result<bool> {
        self.begin()?;
        self.settle().await?;
        Request::Barrier {
            key: key.clone(),
            world_size,
        }
        .encode(&mut self.output);
        self.flush().await?;
        let released = match timeout {
            None => Some(self.read_byte().await?),
            Some(t) => tokio::time::timeout(t, self.read_byte())
                .await
                .ok()
                .transpose()?,
        };
        match released {
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
                self.settle().await?;
                self.busy = false;
                return Ok(false);
            }
        }
        self.busy = false;
        Ok(true)
    }

    /// CHECK: true iff every key is present.
    pub async fn check(&mut self, keys: &[Bytes]) -> Result<bool> {
        match self
            .call(&Request::Check {
                keys: keys.to_vec(),
            })
            .await?
        {
            Some(Reply::Byte(READY)) => Ok(true),
            Some(Reply::Byte(NOT_READY)) => Ok(false),
            other => Err(Error::Protocol(format!(
                "ready or not_ready response expected, got {other:?}"
            ))),
        }
    }

    /// A request whose reply is an `i64` (ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN).
    pub async fn call_int(&mut self, request: &Request) -> Result<i64> {
        match self.call(request).await? {
            Some(Reply::Int(n)) => Ok(n),
            other => Err(Error::Protocol(format!(
                "expected an integer reply, got {other:?}"
            ))),
        }
    }

    /// A request whose reply is one value (GET, COMPARE_SET).
    pub async fn call_value(&mut self, request: &Request) -> Result<Bytes> {
        match self.call(request).await? {
            Some(Reply::Value(v)) => Ok(v),
            other => Err(Error::Protocol(format!(
                "expected a value reply, got {other:?}"
            ))),
        }
    }
}
