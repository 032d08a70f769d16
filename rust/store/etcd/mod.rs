//! `EtcdStore`: a torch store whose state lives in an etcd cluster (v3 API).
//!
//! Why etcd: a TCPStore lives in one process (rank 0 or `ferrodist-store`); when that host dies
//! the job's store dies with it. An etcd cluster of three or five members survives the loss of
//! any minority, keeps every acknowledged write, and is often already there (Kubernetes).
//!
//! How torch's semantics map onto etcd (`layout.rs` has the key names):
//!
//! * `set`, `multi_set`: puts (`multi_set` as transactions, so each batch lands at once; a key
//!   given twice keeps its last value, as in torch's stores, since etcd refuses it twice in one).
//! * `add`, `compare_set`, `append`, `delete_key`, queue push and pop: one compare-and-swap
//!   transaction each, exactly once even across lost replies (`rmw.rs`).
//! * `get`, `wait`, `multi_get`, blocking `queue_pop`: a read, then a watch from that read's
//!   revision (`watch.rs`); no polling and no lost wake-up. Ctrl-C is checked beside the one
//!   watch, not by re-arming it (`interruptible.rs`).
//! * `enroll` (a rendezvous's arrivals): a key per member and a count, no shared key (`roll.rs`).
//! * Where torch's stores disagree, this one answers as torch's `HashStore` (one shared map
//!   with no internal keys): `add` on an empty value counts from 0, `num_keys` counts the user's
//!   keys, `barrier` is torch's add-and-wait fallback.
//!
//! Every call has a deadline: waits their timeout, everything else the store timeout (but at
//! least 5 s, enough to ride out an election; 300 s when the store timeout is zero), retrying
//! through elections (`retry.rs`). The async work runs on the process's one runtime; these
//! methods block the calling thread. A finished job's keys go with [`EtcdStore::purge`].
//!
//! Login: `credentials.rs` (a password is never shown, never taken from a command line, and
//! sent only over TLS unless the caller explicitly allows plain http).
//!
//! `served.rs` has the same operations async and on raw wire keys, for `ferrodist-store
//! --backend etcd://...` (a TCPStore server whose state is this store's).

mod blocking;
pub mod credentials;
mod engine;
mod layout;
mod options;
mod queue;
mod retry;
mod rmw;
mod roll;
pub mod served;
mod watch;

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Client, DeleteOptions, GetOptions};

pub use credentials::{Credentials, PasswordSource};
pub use engine::EtcdEngine;
pub use layout::{check_prefix, Layout, MAX_PREFIX_LEN};
pub use options::{EtcdOptions, TlsFiles};

use self::retry::retrying;
use self::rmw::Receipts;
use self::served::EmptyValue;
use super::facade::{self, key_bytes, keys_bytes, BlockingEngine};
use super::{
    same_length, Blocking, Capabilities, Deadline, Interrupt, Roll, Store, Unblocked,
    DEFAULT_TIMEOUT,
};
use crate::error::{Error, Result};
use crate::runtime::runtime;

/// What every handle of one store shares: the connection and the receipt slots.
struct Shared {
    /// The gRPC connection. Its tasks run on the runtime of the process that made it; a forked
    /// child has that memory but not those threads, so there it is never used nor dropped
    /// (dropping it would poke the parent's runtime): see [`Shared::usable`] and `Drop`.
    client: ManuallyDrop<Client>,
    /// The process that connected.
    pid: u32,
    receipts: Receipts,
    endpoints: Vec<String>,
}

impl Shared {
    /// An error in a forked child: its parent's connection cannot serve it.
    fn usable(&self) -> Result<()> {
        if self.pid == std::process::id() {
            return Ok(());
        }
        Err(Error::Store(format!(
            "this EtcdStore was connected in process {} and cannot be used after fork; \
             make a new EtcdStore in the child",
            self.pid
        )))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.client) };
        }
        // In a forked child the connection is leaked on purpose (see the field).
    }
}

/// A [`Store`] on an etcd cluster; cheap to clone (clones share the connection).
pub struct EtcdStore {
    shared: Arc<Shared>,
    layout: Layout,
    timeout: Arc<Mutex<Duration>>,
}

impl EtcdStore {
    /// Connects to the cluster named by `options`, within its timeout.
    pub fn connect(options: &EtcdOptions) -> Result<Self> {
        options.validate()?;
        let layout = Layout::new(&options.prefix)?;
        let connect_within = if options.timeout.is_zero() {
            DEFAULT_TIMEOUT
        } else {
            options.timeout
        };
        let deadline = Deadline::after(connect_within);
        let client = runtime().block_on(options.connect(deadline))?;
        Ok(EtcdStore {
            shared: Arc::new(Shared {
                client: ManuallyDrop::new(client),
                pid: std::process::id(),
                receipts: Receipts::new(),
                endpoints: options.endpoints.clone(),
            }),
            layout,
            timeout: Arc::new(Mutex::new(options.timeout)),
        })
    }

    /// The job prefix every key lives under.
    pub fn prefix(&self) -> &str {
        self.layout.prefix()
    }

    /// The endpoints the store was given.
    pub fn endpoints(&self) -> &[String] {
        &self.shared.endpoints
    }

    /// Removes every key of the job (values, queues, receipts, rolls) and no other job's (see
    /// `layout.rs`); returns how many etcd keys went. Call it once the job is done: etcd keeps
    /// keys until they are deleted.
    pub fn purge(&self) -> Result<i64> {
        let job = self.layout.job();
        self.call("purge", |mut kv| {
            let job = job.clone();
            async move {
                let deleted = kv
                    .delete(job, Some(DeleteOptions::new().with_prefix()))
                    .await?;
                Ok(Ok(deleted.deleted()))
            }
        })
    }

    /// Deadline of a call that does not wait for other ranks.
    fn call_deadline(&self) -> Deadline {
        Deadline::after(bounded(self.timeout()))
    }

    /// Runs a retried etcd call under the call deadline, blocking this thread.
    fn call<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        F: Fn(etcd_client::KvClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Result<T>, etcd_client::Error>>,
    {
        self.shared.usable()?;
        let kv = self.shared.client.kv_client();
        runtime().block_on(retrying(what, self.call_deadline(), || attempt(kv.clone())))
    }

    /// `wait`, running `gap` once between the read that finds a key missing and the watch
    /// that follows it. For tests: a write landed in that gap must still end the wait.
    pub fn wait_with_gap(
        &self,
        keys: &[String],
        timeout: Duration,
        gap: impl std::future::Future<Output = ()>,
    ) -> Result<()> {
        let keys = keys_bytes(keys);
        self.shared.usable()?;
        let waiting = self.until_present_with(&keys, None, gap);
        if let Some(done) = self.watching(waiting, timeout, None) {
            return done;
        }
        match BlockingEngine::missing(self, &keys) {
            missing if missing.is_empty() => Ok(()),
            missing => {
                let missing: Vec<String> = missing
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect();
                Err(Error::wait_timeout("wait", timeout, &missing))
            }
        }
    }
}

/// Shortest deadline of a call that does not wait for other ranks: long enough to ride out an
/// etcd leader election (about a second) and a retry. A store timeout shorter than this (tests
/// use milliseconds, for waits) must not make a plain `set` fail while the cluster elects.
pub(super) const SHORTEST_CALL_DEADLINE: Duration = Duration::from_secs(5);

/// A call's deadline: the store timeout, at least [`SHORTEST_CALL_DEADLINE`], and torch's
/// default when the timeout is zero ("no timeout" is for waits on other ranks, not for a put to
/// a cluster that is gone).
fn bounded(timeout: Duration) -> Duration {
    if timeout.is_zero() {
        DEFAULT_TIMEOUT
    } else {
        timeout.max(SHORTEST_CALL_DEADLINE)
    }
}

impl Store for EtcdStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        runtime().block_on(self.wire_set(key.as_bytes(), value))
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let mut values = facade::values(self, "get", &[key_bytes(key)], timeout, None)?;
        Ok(values.pop().expect("one key, one value"))
    }

    /// torch's HashStore counts an empty value as 0 (its TCP servers refuse it).
    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        runtime().block_on(self.add_to(key.as_bytes(), amount, EmptyValue::CountsAsZero))
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let after = runtime().block_on(self.wire_compare_set(key.as_bytes(), expected, desired));
        after.map(|value| value.to_vec())
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        runtime().block_on(self.wire_check(keys))
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        facade::present(self, "wait", &keys_bytes(keys), timeout, None)
    }

    /// Writes are not bounded: one may take 5 s (an election) even when the store timeout is
    /// shorter.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            extended_api: true,
            bounded_writes: false,
            ..Capabilities::BASIC
        }
    }

    /// Interruptible at no cost: the check runs beside the one watch (`blocking.rs`).
    fn block_interruptibly(
        &self,
        call: Blocking<'_>,
        timeout: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Unblocked> {
        facade::block_interruptibly(self, call, timeout, interrupted)
    }

    fn roll(&self) -> Option<&dyn Roll> {
        Some(self)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        let deleted = runtime().block_on(self.wire_delete_key(key.as_bytes()))?;
        Ok(deleted == 1)
    }

    fn num_keys(&self) -> Result<i64> {
        runtime().block_on(self.wire_num_keys())
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(EtcdStore {
            shared: Arc::clone(&self.shared),
            layout: self.layout.clone(),
            timeout: Arc::new(Mutex::new(self.timeout())),
        }))
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        runtime().block_on(self.wire_append(key.as_bytes(), value))
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        facade::values(self, "multi_get", &keys_bytes(keys), self.timeout(), None)
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        same_length(keys, values)?;
        let pairs: Vec<(Bytes, Bytes)> = keys
            .iter()
            .zip(values)
            .map(|(k, v)| {
                (
                    Bytes::copy_from_slice(k.as_bytes()),
                    Bytes::copy_from_slice(v),
                )
            })
            .collect();
        runtime().block_on(self.wire_multi_set(&pairs))
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        runtime().block_on(self.wire_queue_push(key.as_bytes(), value))
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        facade::pop(self, &key_bytes(key), timeout, None)
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        if block {
            return self.queue_pop_timeout(key, self.timeout());
        }
        match runtime().block_on(self.wire_queue_pop(key.as_bytes()))? {
            (_, Some(front)) => Ok(front.to_vec()),
            (_, None) => Err(Error::QueueEmpty),
        }
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        runtime().block_on(self.wire_queue_len(key.as_bytes()))
    }

    /// Keys that are not UTF-8 (a stock client may set any bytes) are left out.
    fn list_keys(&self) -> Result<Vec<String>> {
        let keys = runtime().block_on(self.wire_list_keys())?;
        Ok(keys
            .into_iter()
            .filter_map(|k| String::from_utf8(k.to_vec()).ok())
            .collect())
    }
}

/// The etcd keys starting with `prefix`, names only: one range read (a call's attempt).
async fn keys_under(
    mut kv: etcd_client::KvClient,
    prefix: Vec<u8>,
) -> std::result::Result<Result<Vec<Vec<u8>>>, etcd_client::Error> {
    let options = GetOptions::new().with_prefix().with_keys_only();
    let found = kv.get(prefix, Some(options)).await?;
    Ok(Ok(found.kvs().iter().map(|kv| kv.key().to_vec()).collect()))
}
