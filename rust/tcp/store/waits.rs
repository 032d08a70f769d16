//! The calls that wait for keys (`wait`, `get`, `multi_get`, the wait of a blocking
//! `queue_pop`): WAIT, and the request it releases, within the wait's own timeout.
//!
//! A server whose state outlives it (`ferrodist-store --backend etcd://...`; its handshake says
//! so) may be killed and started again while a client waits: the keys are still there, and the
//! one the waiter wants may be set seconds later. Such a wait does not fail when its connection
//! breaks: it is sent again on a new connection, within its own deadline. That is safe because
//! WAIT and the GET or MULTI_GET held behind it change nothing; a request that changes state
//! (ADD, COMPARE_SET, a queue pop, BARRIER) is never sent again, since the first one may have
//! been applied before the connection broke.
//!
//! Against a server that keeps its state in memory, a broken connection fails the wait at once
//! with [`Error::ConnectionClosed`], as before: a restarted server has lost every key, so waiting
//! on would only delay the error. So does a wait whose reconnect reaches a server that does not
//! say its state outlives it (another server took the address).
//!
//! The deadline holds throughout: reconnects are paced by the pool's backoff (never a spin) and
//! end at the wait's deadline, where the wait ends with its own timeout error, which then names
//! the keys, the store's address and why it could not be reached.

use std::time::Duration;

use bytes::Bytes;

use super::{wire_all, TcpStore, CANCEL_GRACE};
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::codec::{Reply, Request};

/// How one attempt at a wait ended.
enum Attempt {
    /// The keys arrived (`Ok`, with the follow-up's reply), or the wait's timeout passed.
    Done(std::result::Result<Option<Reply>, ()>),
    /// The connection to a durable server broke midway: send the wait again.
    Lost(Error),
    /// A durable server could not be reached again by the wait's deadline (why, and where).
    Unreachable(String),
    /// The server reached after a loss does not keep its state beyond its life.
    Replaced,
}

impl TcpStore {
    /// Waits until every key of `keys` exists, then sends `follow` (if any) and returns its
    /// reply; `timeout` zero waits forever. See the module docs for a broken connection.
    pub(super) fn wait_for(
        &self,
        keys: &[String],
        follow: Option<Request>,
        timeout: Duration,
    ) -> Result<Option<Reply>> {
        let wire_keys = wire_all(keys);
        let until = Deadline::after(timeout);
        let mut lost: Option<Error> = None;
        loop {
            match self.wait_once(&wire_keys, follow.clone(), until, lost.is_some())? {
                Attempt::Done(Ok(reply)) => return Ok(reply),
                Attempt::Done(Err(())) => return Err(wait_timeout(timeout, keys, None)),
                Attempt::Unreachable(why) => return Err(wait_timeout(timeout, keys, Some(why))),
                Attempt::Replaced => return Err(lost.expect("replaced only after a loss")),
                Attempt::Lost(err) => {
                    tracing::info!(%err, keys = ?keys,
                        "the store's state outlives it: sending the wait again once it is back");
                    self.conns.lost_connection();
                    lost = Some(err);
                }
            }
        }
    }

    /// One WAIT (with `follow` behind it) on a connection of the pool, bounded by `until`.
    fn wait_once(
        &self,
        keys: &[Bytes],
        follow: Option<Request>,
        until: Deadline,
        after_loss: bool,
    ) -> Result<Attempt> {
        // The wait's own deadline bounds the wait; the call's adds room for the CANCEL_WAIT
        // exchange an earlier wait on the connection may need.
        let call = Deadline::after(until.remaining().map_or(Duration::ZERO, |left| {
            left.max(Duration::from_millis(1)) + CANCEL_GRACE
        }));
        // A durable server may be restarting: its reconnects go on until the wait's deadline,
        // never past it. Any other server gets one attempt, as every call does.
        let durable = self.conns.is_durable();
        let mut client = match self.conns.checkout(if durable { until } else { call }) {
            Ok(client) => client,
            Err(Error::NetworkTimeout(why)) if durable => return Ok(Attempt::Unreachable(why)),
            Err(err) => return Err(err),
        };
        if after_loss {
            // Only a server that says its state outlives it gets the wait again.
            let introduced = client.await_introduced(call);
            if introduced.is_err() || !client.is_durable_server() {
                self.conns.checkin(client);
                return match introduced {
                    Err(err @ Error::ConnectionClosed { .. }) => Ok(Attempt::Lost(err)),
                    Err(err) => Err(err),
                    Ok(()) => Ok(Attempt::Replaced),
                };
            }
        }
        let outcome = client.wait_then(call, keys, follow, until.remaining());
        let durable = client.is_durable_server();
        self.conns.checkin(client);
        match outcome {
            Ok(done) => Ok(Attempt::Done(done)),
            Err(err @ Error::ConnectionClosed { .. }) if durable => Ok(Attempt::Lost(err)),
            Err(err) => Err(err),
        }
    }
}

/// A wait's timeout, as torch words it (`keys: /a, /b`), with why the store was out of reach
/// when it was.
fn wait_timeout(after: Duration, keys: &[String], unreachable: Option<String>) -> Error {
    let shown: Vec<String> = keys.iter().map(|k| format!("/{k}")).collect();
    let mut detail = format!("keys: {}", shown.join(", "));
    if let Some(why) = unreachable {
        detail.push_str(&format!(" ({why})"));
    }
    Error::Timeout {
        op: "wait".into(),
        after,
        detail,
    }
}
