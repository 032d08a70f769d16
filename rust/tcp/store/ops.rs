//! The [`Store`] methods of [`TcpStore`]: each maps a user call onto torch's wire sequence.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{expect_value, wire, wire_all, TcpStore};
use crate::error::{Error, Result};
use crate::store::{Capabilities, Store};
use crate::tcp::client::Client;
use crate::tcp::codec::{Reply, Request};

const LEGACY_QUEUES: &str = "queues not implemented on legacy TCPStore backend";

impl TcpStore {
    fn send(&self, request: Request) -> Result<()> {
        self.run(None, |c, d| c.call(d, &request).map(drop))
    }

    fn call_int(&self, request: Request) -> Result<i64> {
        self.run(None, |c, d| c.call_int(d, &request))
    }

    fn call_value(&self, request: Request) -> Result<Vec<u8>> {
        self.run(None, |c, d| c.call_value(d, &request).map(|v| v.to_vec()))
    }

    fn require_queues(&self) -> Result<()> {
        if self.use_libuv {
            Ok(())
        } else {
            Err(Error::NotImplemented(LEGACY_QUEUES.into()))
        }
    }

    /// Why the server closed the connection on an ADD. torch's servers (and ours) have no error
    /// reply, so a value that is not an integer ends the connection and a stock client can only
    /// ask whether the server crashed. This reconnects and reads the value: if it is not an
    /// integer, the error says so (with its length, never its bytes); otherwise the original
    /// error stands.
    fn explain_refused_add(&self, key: &str, closed: Error) -> Error {
        let probe = self.run(None, |c, d| {
            if !c.check(d, &[wire(key)])? {
                return Ok(None);
            }
            c.call_value(d, &Request::Get { key: wire(key) }).map(Some)
        });
        match probe {
            Ok(Some(value)) => match crate::store::parse_counter(key, &value) {
                Err(not_an_integer) => Error::InvalidArgument(format!(
                    "{not_an_integer}; the server refused the add and closed the connection \
                     (the store itself is fine)"
                )),
                Ok(_) => closed,
            },
            _ => closed,
        }
    }

    /// A new connection to the same server (torch's `clone()`): not a master, no worker count.
    pub fn connect_clone(&self) -> Result<TcpStore> {
        let timeout = self.timeout();
        let token = self.conns.token();
        let client = Client::connect_with_token(&self.host, self.port, timeout, token)?;
        Ok(TcpStore {
            host: self.host.clone(),
            port: self.port,
            use_libuv: self.use_libuv,
            timeout: std::sync::Mutex::new(timeout),
            conns: crate::tcp::client::conn_pool::ConnPool::new(
                &self.host,
                self.port,
                token.cloned(),
                Some(client),
            ),
            server: self.server.clone(),
            barrier_support: Default::default(),
        })
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.send(Request::Set {
            key: wire(key),
            value: Bytes::copy_from_slice(value),
        })
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let keys = [key.to_owned()];
        expect_value(self.wait_for(&keys, Some(Request::Get { key: wire(key) }), timeout)?)
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        let added = self.call_int(Request::Add {
            key: wire(key),
            delta: amount,
        });
        match added {
            Err(err @ (Error::ConnectionClosed { .. } | Error::Network(_))) => {
                Err(self.explain_refused_add(key, err))
            }
            other => other,
        }
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.call_value(Request::CompareSet {
            key: wire(key),
            expected: Bytes::copy_from_slice(expected),
            desired: Bytes::copy_from_slice(desired),
        })
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        let keys = wire_all(keys);
        self.run(None, |c, d| c.check(d, &keys))
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.wait_for(keys, None, timeout.unwrap_or_else(|| self.timeout()))
            .map(drop)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.call_int(Request::DeleteKey { key: wire(key) })? == 1)
    }

    fn num_keys(&self) -> Result<i64> {
        self.call_int(Request::GetNumKeys)
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.connect_clone()?))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            extended_api: true,
            ..Capabilities::BASIC
        }
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.send(Request::Append {
            key: wire(key),
            value: Bytes::copy_from_slice(value),
        })
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        let follow = Request::MultiGet {
            keys: wire_all(keys),
        };
        match self.wait_for(keys, Some(follow), self.timeout())? {
            Some(Reply::Values(values)) => Ok(values.iter().map(|v| v.to_vec()).collect()),
            other => Err(Error::Protocol(format!("expected values, got {other:?}"))),
        }
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        crate::store::same_length(keys, values)?;
        let pairs = keys
            .iter()
            .zip(values)
            .map(|(k, v)| (wire(k), Bytes::copy_from_slice(v)))
            .collect();
        self.send(Request::MultiSet { pairs })
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.require_queues()?;
        self.send(Request::QueuePush {
            key: wire(key),
            value: Bytes::copy_from_slice(value),
        })
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        self.require_queues()?;
        if block {
            self.wait(&[key.to_owned()], None)?;
        }
        let request = Request::QueuePop { key: wire(key) };
        let reply = self.run(None, |c, d| c.call(d, &request))?;
        match reply {
            Some(Reply::Popped { value: Some(v), .. }) => Ok(v.to_vec()),
            Some(Reply::Popped { value: None, .. }) => Err(Error::QueueEmpty),
            other => Err(Error::Protocol(format!(
                "expected a queue reply, got {other:?}"
            ))),
        }
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        self.require_queues()?;
        self.call_int(Request::QueueLen { key: wire(key) })
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        let reply = self.run(None, |c, d| c.call(d, &Request::ListKeys))?;
        match reply {
            Some(Reply::Keys(keys)) => Ok(keys
                .iter()
                .filter_map(|k| k.strip_prefix(b"/"))
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect()),
            other => Err(Error::Protocol(format!("expected keys, got {other:?}"))),
        }
    }

    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<()> {
        // BARRIER where the server has it, torch's add + wait otherwise (store_barrier.rs).
        self.barrier_any(key, world_size, timeout)
    }
}
