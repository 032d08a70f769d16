//! One call's traffic on the socket: mark the call begun under its deadline, queue requests
//! (refusing one a server would close the connection on), flush them, and read replies.
//!
//! Every sequence (handshake, calls, waits) goes through these few functions, so the rules that
//! keep a connection trustworthy live in one place: a call that passes its deadline midway
//! leaves the client broken, and an EOF is noticed before a fire-and-forget request is lost.

use std::time::{Duration, Instant};

use super::socket::Filled;
use super::{closed, Client, Introduction, CLOSED_BY_SERVER};
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::codec::{decode_reply, scan_request, Limits, Reply, ReplyKind, Request};

/// Fire-and-forget requests check for a closed connection at most this often.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(1);

/// The earlier of two optional instants (`None` is "never").
pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

impl Client {
    pub(super) fn passed_deadline(&self) -> Error {
        Error::NetworkTimeout(format!(
            "no reply from the store at {} within {}ms",
            self.peer,
            self.deadline.timeout().as_millis()
        ))
    }

    pub(super) fn flush(&mut self) -> Result<()> {
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
    pub(super) fn read_reply_until(
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

    pub(super) fn read_reply(&mut self, kind: ReplyKind) -> Result<Reply> {
        match self.read_reply_until(kind, None)? {
            Some(reply) => Ok(reply),
            None => Err(self.passed_deadline()),
        }
    }

    pub(super) fn read_byte(&mut self) -> Result<u8> {
        self.read_byte_until(None)?
            .ok_or_else(|| self.passed_deadline())
    }

    pub(super) fn read_byte_until(&mut self, until: Option<Instant>) -> Result<Option<u8>> {
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
    pub(super) fn begin(&mut self, deadline: Deadline) -> Result<()> {
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

    /// Queues `request` for sending, unless it breaks the servers' [`Limits`] (torch's libuv
    /// server and ferrodist's close the connection on such a request, and one with no reply,
    /// such as SET, would be lost silently and break the next call). Then nothing is sent, the
    /// connection stays usable, and the error names the limit.
    pub(super) fn encode_checked(&mut self, request: &Request) -> Result<()> {
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
}
