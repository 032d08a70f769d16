//! Requests with one reply: the generic [`Client::call`] and its typed forms.
//!
//! A pending wait is cancelled before any of them goes out (see `waits.rs`).

use bytes::Bytes;

use super::Client;
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::codec::{Reply, Request, NOT_READY, READY};

impl Client {
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
