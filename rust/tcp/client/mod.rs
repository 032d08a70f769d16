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
//! One `impl Client` per concern, so each sequence can be read on its own:
//!
//! * `mod.rs`: the [`Client`], its state and what it tells its owner (peer, broken, durable).
//! * `connect.rs`: resolve, connect, and retry with torch's backoff until the deadline.
//! * `handshake.rs`: VALIDATE + PING, the ferrodist marker and the token exchange.
//! * `no_ping.rs`: the handshake for torch 2.4's servers, which have no PING.
//! * `io.rs`: one call's framing on the socket: begin, send, read replies under its deadline.
//! * `calls.rs`: requests with one reply (CHECK, ADD, GET, ...).
//! * `waits.rs`: WAIT (with its pipelined follow-up), BARRIER and CANCEL_WAIT.
//! * `socket.rs`: the socket, read by the calling thread with a deadline.
//! * `conn_pool.rs`: a store's connections, one per concurrent call.
//!
//! [`FERRODIST_PING`]: crate::tcp::codec::FERRODIST_PING
//! [`FERRODIST_PONG`]: crate::tcp::codec::FERRODIST_PONG

pub mod conn_pool;
pub mod socket;

mod calls;
mod connect;
mod handshake;
mod io;
mod no_ping;
mod waits;

use std::time::Instant;

use bytes::{Bytes, BytesMut};

use self::socket::ClientSocket;
use crate::error::Error;
use crate::store::Deadline;
use crate::tcp::codec::Request;

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

/// Where the client stands in telling the server that it is ferrodist's
/// ([`FERRODIST_PING`](crate::tcp::codec::FERRODIST_PING)).
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
    /// The server said its state outlives it (see
    /// [`FERRODIST_PONG_DURABLE`](crate::tcp::codec::FERRODIST_PONG_DURABLE)).
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

impl Client {
    /// torch's description of this connection's socket (see [`ClientSocket::describe`]).
    pub fn describe(&self) -> String {
        self.socket.describe()
    }

    /// `host:port` this client talks to.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// True when the server is ferrodist's (it answered the handshake's PING with
    /// [`FERRODIST_PONG`](crate::tcp::codec::FERRODIST_PONG)).
    pub fn is_ferrodist_server(&self) -> bool {
        self.ferrodist_server
    }

    /// True when the server's state outlives it (it answered
    /// [`FERRODIST_PONG_DURABLE`](crate::tcp::codec::FERRODIST_PONG_DURABLE)).
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
}
