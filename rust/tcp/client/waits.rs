//! Waits: WAIT with its follow-up (pipelined against ferrodist's server), BARRIER, and
//! torch's CANCEL_WAIT exchange that ends a wait still registered at the server.
//!
//! A wait that times out stays registered, so calling it again with the same keys resumes it
//! without a WAIT/CANCEL_WAIT pair; any other call cancels it first ([`Client::settle`]).

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Client, PendingWait};
use crate::error::{Error, Result};
use crate::store::Deadline;
use crate::tcp::codec::{Reply, Request, STOP_WAITING, WAIT_CANCELED};

impl Client {
    /// Cancels a pending wait (torch's CANCEL_WAIT exchange), reading every reply it owed.
    pub(super) fn settle(&mut self) -> Result<()> {
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
}
