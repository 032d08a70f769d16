//! The handshake for servers without PING: torch 2.4's (both backends) closes the connection
//! that sends opcode 13, since its client only ever sends VALIDATE.
//!
//! [`Client::connect_once`] tries the usual VALIDATE + PING first; when the server closes the
//! connection on it, [`without_ping`] connects again and sends VALIDATE alone, then a CHECK of
//! a key nobody writes (an opcode every torch server has had since VALIDATE existed), so a
//! reply still proves the server is alive and speaking the protocol before the client is
//! handed out. Such a server is never ferrodist's, so none of the ferrodist-only refinements
//! apply. A server that fails this too gets the first error back, which says more.

use std::net::{SocketAddr, TcpStream};

use bytes::Bytes;

use super::{Client, ClientSocket};
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::codec::{Reply, ReplyKind, Request, VALIDATE_MAGIC};

/// The key the liveness CHECK asks about (torch's client never writes an unprefixed key).
const PROBE_KEY: &[u8] = b"ferrodist-handshake-probe";

/// After `first` (the VALIDATE + PING handshake's error): when the server closed the
/// connection on it, one more attempt at `addr` without PING; otherwise `first` as it was.
pub(super) fn without_ping(
    first: Error,
    addr: SocketAddr,
    peer: String,
    deadline: Deadline,
) -> Result<Client> {
    if !matches!(first, Error::ConnectionClosed { .. }) {
        return Err(first);
    }
    let stream = match deadline.remaining() {
        Some(left) if left.is_zero() => return Err(first),
        Some(left) => TcpStream::connect_timeout(&addr, left),
        None => TcpStream::connect(addr),
    };
    let Ok(socket) = stream.and_then(|s| ClientSocket::new(s, deadline.timeout())) else {
        return Err(first);
    };
    let mut client = Client::unshaken(socket, peer, deadline);
    Request::Validate {
        magic: VALIDATE_MAGIC,
    }
    .encode(&mut client.output);
    Request::Check {
        keys: vec![Bytes::from_static(PROBE_KEY)],
    }
    .encode(&mut client.output);
    match client
        .flush()
        .and_then(|()| client.read_reply(ReplyKind::Byte))
    {
        Ok(Reply::Byte(_)) => {
            tracing::debug!(peer = %client.peer, "server without PING (torch < 2.5): connected");
            Ok(client)
        }
        _ => Err(first),
    }
}
