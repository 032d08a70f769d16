//! [`TcpStore`]'s barrier on any server: the BARRIER request where the server has it, torch's
//! add + wait barrier where it does not.
//!
//! BARRIER (opcode 18) is new in torch 2.13. There is no version negotiation on the wire, and
//! an older torch server (2.11's, both backends) closes the connection that sends an opcode it
//! does not know. So a store learns what its server can do from the server itself:
//!
//! * ferrodist's server (it says so in the handshake) always has BARRIER;
//! * otherwise the first barrier sends BARRIER; a server that closes the connection on it, and
//!   again on a fresh connection that it accepted, lacks it. The retry tells a server that
//!   refuses BARRIER from a connection that was already dead (a restarted server): the second
//!   attempt then succeeds, or fails to connect at all;
//! * a server without BARRIER gets torch's base-class barrier (`Store::barrier` in C++), with
//!   torch's keys: `add(key/num_members, 1)`; the arrival that makes it `world_size` sets
//!   `key/last_member`; everyone waits for that key. An old server closes the connection
//!   before acting on a request it cannot parse, so the refused BARRIER counted nothing.
//!
//! The answer is kept per store, so only the first barrier pays the probe (one reconnect).

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use super::TcpStore;
use crate::error::{Error, Result};
use crate::store::Store;

const UNKNOWN: u8 = 0;
const NATIVE: u8 = 1;
const ADD_WAIT: u8 = 2;

/// Whether the server of a store handles BARRIER, once known.
#[derive(Debug, Default)]
pub(super) struct BarrierSupport(AtomicU8);

impl BarrierSupport {
    fn get(&self) -> u8 {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, value: u8) {
        self.0.store(value, Ordering::Relaxed);
    }
}

/// The server closed the connection: on a BARRIER, what a server without it does.
fn closed_by_server(err: &Error) -> bool {
    matches!(err, Error::ConnectionClosed { .. })
}

impl TcpStore {
    /// Blocks until `world_size` callers reach barrier `key`, on whatever server this is.
    pub(super) fn barrier_any(
        &self,
        key: &str,
        world_size: i64,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        if self.barrier_support.get() == ADD_WAIT {
            return self.add_wait_barrier(key, world_size, timeout);
        }
        let first = self.native_barrier(key, world_size, timeout);
        match first {
            Err(ref err) if closed_by_server(err) && self.barrier_support.get() == UNKNOWN => {}
            other => {
                if other.is_ok() {
                    self.barrier_support.set(NATIVE);
                }
                return other;
            }
        }
        // Closed on the first BARRIER this store sent: once more on a fresh connection (the
        // run reconnects first; if the server is gone, that fails and so does the barrier).
        match self.native_barrier(key, world_size, timeout) {
            Err(err) if closed_by_server(&err) => {
                tracing::debug!(
                    peer = %format!("{}:{}", self.host, self.port),
                    "the server closes the connection on BARRIER (torch < 2.13): using add + wait"
                );
                self.barrier_support.set(ADD_WAIT);
                self.add_wait_barrier(key, world_size, timeout)
            }
            other => {
                if other.is_ok() {
                    self.barrier_support.set(NATIVE);
                }
                other
            }
        }
    }

    /// BARRIER: one request; a ferrodist server is marked as having it from the handshake.
    fn native_barrier(&self, key: &str, world_size: i64, timeout: Duration) -> Result<()> {
        let bound = (!timeout.is_zero()).then_some(timeout);
        let wire_key = super::wire(key);
        let limit = bound.map_or(Duration::ZERO, |t| t + super::CANCEL_GRACE);
        let released = self.run(Some(limit), |c, d| {
            if c.is_ferrodist_server() {
                self.barrier_support.set(NATIVE);
            }
            c.barrier(d, wire_key, world_size, bound)
        })?;
        if released {
            Ok(())
        } else {
            Err(barrier_timeout(key, timeout))
        }
    }

    /// torch's base-class barrier from ADD, SET and WAIT, for servers without BARRIER.
    fn add_wait_barrier(&self, key: &str, world_size: i64, timeout: Duration) -> Result<()> {
        let last = format!("{key}/last_member");
        if self.add(&format!("{key}/num_members"), 1)? == world_size {
            self.set(&last, b"1")?;
        }
        match self.wait(&[last], Some(timeout)) {
            Err(Error::Timeout { .. }) => Err(barrier_timeout(key, timeout)),
            other => other,
        }
    }
}

fn barrier_timeout(key: &str, after: Duration) -> Error {
    Error::Timeout {
        op: "barrier".into(),
        after,
        detail: format!("key: {key}"),
    }
}
