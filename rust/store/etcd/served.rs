//! The operations on etcd, each written once: what `ferrodist-store --backend etcd://...`
//! serves each wire request from ([`EtcdEngine`](super::EtcdEngine) offers them as the storage
//! engine's operations), and what `EtcdStore`'s own non-blocking `Store` methods run (blocking
//! on the runtime).
//!
//! They are:
//!
//! * **async**, on the process's runtime: a server connection waiting on etcd holds no thread,
//!   and a slow etcd call delays only the connection that made it;
//! * on **raw keys** (bytes; the wire's carry torch's `/` prefix), stored under the same `kv/`
//!   and `queue/` namespaces of the job, so the same job read through an `EtcdStore` shows the
//!   keys a stock client set through the server with their wire names;
//! * **torch's TCP servers' answers**, as the in-memory engine (`store/db.rs`) gives them: a GET
//!   of a missing key is empty (clients WAIT first), ADD on an empty value is refused (the
//!   `Store` API counts it as 0, as torch's HashStore: `EmptyValue`), a BARRIER counts
//!   arrivals on its key. The `Store` API's blocking calls (get, multi_get, a blocking pop)
//!   wait with a watch instead (`mod.rs`, `queue.rs`).
//!
//! Writes are the same exactly-once transactions as the store's (`rmw.rs`), so a server that
//! dies between a client's request and its reply never applies an ADD twice when the client
//! asks again of another server.

use bytes::Bytes;
use etcd_client::{EventType, GetOptions, KvClient, Txn, TxnOp, TxnOpResponse, WatchOptions};

use super::queue;
use super::retry::{fatal, is_transient, retrying};
use super::rmw::Change;
use super::watch::MAX_TXN_OPS;
use super::EtcdStore;
use crate::error::Result;
use crate::store::parse_counter;

/// How ADD reads an empty value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EmptyValue {
    /// As 0 (torch's HashStore, and so the `Store` API).
    CountsAsZero,
    /// As a value that is not an integer (torch's TCP servers).
    Refused,
}

/// Pause before reading again after a broken watch or a transient failure.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

fn counter(key: &[u8], value: &[u8]) -> Result<i64> {
    parse_counter(&String::from_utf8_lossy(key), value)
}

/// QUEUE_POP's result through a read-modify-write: the length before the pop (8 bytes, little
/// endian), then the element. An empty queue keeps nothing and returns nothing.
fn pop_record(len_before: i64, front: &[u8]) -> Vec<u8> {
    let mut record = len_before.to_le_bytes().to_vec();
    record.extend_from_slice(front);
    record
}

impl EtcdStore {
    /// Runs a retried etcd call under the call deadline, on the caller's task.
    pub(super) async fn call_async<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        F: Fn(KvClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Result<T>, etcd_client::Error>>,
    {
        self.shared.usable()?;
        let kv = self.shared.client.kv_client();
        retrying(what, self.call_deadline(), || attempt(kv.clone())).await
    }

    /// Exactly-once read-modify-write of one etcd key, on the caller's task.
    async fn update_async(
        &self,
        what: &str,
        key: Vec<u8>,
        change: impl Fn(Option<&[u8]>) -> Result<Change>,
    ) -> Result<Vec<u8>> {
        self.shared.usable()?;
        self.read_modify_write(what, key, self.call_deadline(), change)
            .await
    }

    /// The value of etcd key `key` and the revision of the read.
    pub(super) async fn read_at(&self, what: &str, key: &[u8]) -> Result<(Option<Vec<u8>>, i64)> {
        self.call_async(what, |mut kv| async move {
            let found = kv.get(key, None).await?;
            let revision = found.header().map_or(0, |h| h.revision());
            Ok(Ok((
                found.kvs().first().map(|kv| kv.value().to_vec()),
                revision,
            )))
        })
        .await
    }

    /// SET.
    pub async fn wire_set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let key = self.layout.value(key);
        self.call_async("set", |mut kv| {
            let (key, value) = (key.clone(), value.to_vec());
            async move { kv.put(key, value, None).await.map(|_| Ok(())) }
        })
        .await
    }

    /// GET: the value, empty when the key is missing.
    pub async fn wire_get(&self, key: &[u8]) -> Result<Bytes> {
        let (value, _) = self.read_at("get", &self.layout.value(key)).await?;
        Ok(value.map(Bytes::from).unwrap_or_default())
    }

    /// ADD: a missing key counts from 0; an empty or non-numeric value is refused unchanged.
    pub async fn wire_add(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.add_to(key, delta, EmptyValue::Refused).await
    }

    /// ADD with `empty`'s reading of an empty value (the one quirk in which torch's HashStore
    /// and its TCP servers differ).
    pub(super) async fn add_to(&self, key: &[u8], delta: i64, empty: EmptyValue) -> Result<i64> {
        let sum = self
            .update_async("add", self.layout.value(key), |current| {
                let now = match current {
                    None => 0,
                    Some(b"") if empty == EmptyValue::CountsAsZero => 0,
                    Some(value) => counter(key, value)?,
                };
                let sum = now.wrapping_add(delta).to_string().into_bytes();
                Ok(Change::Put(sum.clone(), sum))
            })
            .await?;
        counter(key, &sum)
    }

    /// COMPARE_SET with torch's four cases.
    pub async fn wire_compare_set(
        &self,
        key: &[u8],
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Bytes> {
        let after = self
            .update_async("compare_set", self.layout.value(key), |current| {
                Ok(match current {
                    None if expected.is_empty() => Change::Put(desired.to_vec(), desired.to_vec()),
                    None => Change::Keep(expected.to_vec()),
                    Some(now) if now == expected => Change::Put(desired.to_vec(), desired.to_vec()),
                    Some(now) => Change::Keep(now.to_vec()),
                })
            })
            .await?;
        Ok(Bytes::from(after))
    }

    /// CHECK: every key has a value or names a non-empty queue.
    pub async fn wire_check<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<bool> {
        let missing = self
            .call_async("check", |_| async {
                self.missing_since(keys).await.map(Ok)
            })
            .await?;
        Ok(missing.iter().all(Option::is_none))
    }

    /// WAIT: returns once every key is present (a read, then a watch from its revision). Runs
    /// until then; the connection bounds it (dropping the future cancels the watch).
    pub async fn wire_wait(&self, keys: &[Bytes]) -> Result<()> {
        self.shared.usable()?;
        self.until_present(keys).await
    }

    /// GETNUMKEYS: the keys with a value (queues excluded).
    pub async fn wire_num_keys(&self) -> Result<i64> {
        let values = self.layout.values();
        self.call_async("num_keys", |mut kv| {
            let options = GetOptions::new().with_prefix().with_count_only();
            let values = values.clone();
            async move { Ok(Ok(kv.get(values, Some(options)).await?.count())) }
        })
        .await
    }

    /// DELETE_KEY: 1 if the key had a value, else 0.
    pub async fn wire_delete_key(&self, key: &[u8]) -> Result<i64> {
        let existed = self
            .update_async("delete_key", self.layout.value(key), |current| {
                Ok(match current {
                    None => Change::Keep(b"0".to_vec()),
                    Some(_) => Change::Delete(b"1".to_vec()),
                })
            })
            .await?;
        Ok(i64::from(existed == b"1"))
    }

    /// APPEND: creates or extends the value.
    pub async fn wire_append(&self, key: &[u8], data: &[u8]) -> Result<()> {
        self.update_async("append", self.layout.value(key), |current| {
            let mut joined = current.unwrap_or_default().to_vec();
            joined.extend_from_slice(data);
            Ok(Change::Put(joined, Vec::new()))
        })
        .await
        .map(drop)
    }

    /// MULTI_GET: one value per key, empty for a missing one.
    pub async fn wire_multi_get(&self, keys: &[Bytes]) -> Result<Vec<Bytes>> {
        let values = self.snapshot(keys).await?;
        Ok(values.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// One value per key, `None` for a missing one, read in one snapshot per `MAX_TXN_OPS`
    /// keys.
    pub(super) async fn snapshot<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Bytes>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let lookups: Vec<TxnOp> = chunk
                .iter()
                .map(|k| TxnOp::get(self.layout.value(k), None))
                .collect();
            let values = self
                .call_async("multi_get", |mut kv| {
                    let txn = Txn::new().and_then(lookups.clone());
                    async move {
                        let response = kv.txn(txn).await?;
                        let values = response.op_responses().into_iter().map(|r| match r {
                            TxnOpResponse::Get(get) => get
                                .kvs()
                                .first()
                                .map(|kv| Bytes::copy_from_slice(kv.value())),
                            _ => None,
                        });
                        Ok(Ok(values.collect::<Vec<_>>()))
                    }
                })
                .await?;
            out.extend(values);
        }
        Ok(out)
    }

    /// MULTI_SET: each key's last value, as torch's stores (which apply the pairs in order)
    /// leave it; etcd refuses a key twice in one transaction, so a key given again is written
    /// once, with its last value, at its last place. Each batch of `MAX_TXN_OPS` distinct keys
    /// is one transaction.
    pub async fn wire_multi_set(&self, pairs: &[(Bytes, Bytes)]) -> Result<()> {
        let writes = last_writes(pairs.iter().map(|(k, v)| (self.layout.value(k), v)));
        for chunk in writes.chunks(MAX_TXN_OPS) {
            let puts: Vec<TxnOp> = chunk
                .iter()
                .map(|(k, v)| TxnOp::put(k.clone(), v.to_vec(), None))
                .collect();
            self.call_async("multi_set", |mut kv| {
                let txn = Txn::new().and_then(puts.clone());
                async move { kv.txn(txn).await.map(|_| Ok(())) }
            })
            .await?;
        }
        Ok(())
    }

    /// QUEUE_PUSH.
    pub async fn wire_queue_push(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.update_async("queue_push", self.layout.queue(key), |current| {
            let grown = queue::pushed(current.unwrap_or_default(), value)?;
            Ok(Change::Put(grown, Vec::new()))
        })
        .await
        .map(drop)
    }

    /// QUEUE_POP: the length before the pop, and the front element when there was one.
    pub async fn wire_queue_pop(&self, key: &[u8]) -> Result<(i64, Option<Bytes>)> {
        let record = self
            .update_async("queue_pop", self.layout.queue(key), |current| {
                let current = current.unwrap_or_default();
                let len = queue::len(current)?;
                Ok(match queue::popped(current)? {
                    None => Change::Keep(Vec::new()),
                    Some((front, rest)) if rest.is_empty() => {
                        Change::Delete(pop_record(len, &front))
                    }
                    Some((front, rest)) => Change::Put(rest, pop_record(len, &front)),
                })
            })
            .await?;
        if record.len() < 8 {
            return Ok((0, None));
        }
        let mut record = Bytes::from(record);
        let len = i64::from_le_bytes(record.split_to(8)[..].try_into().expect("8 bytes"));
        Ok((len, Some(record)))
    }

    /// QUEUE_LEN: 0 for a queue that does not exist.
    pub async fn wire_queue_len(&self, key: &[u8]) -> Result<i64> {
        let (value, _) = self.read_at("queue_len", &self.layout.queue(key)).await?;
        queue::len(&value.unwrap_or_default())
    }

    /// LIST_KEYS: every key with a value, as its wire bytes.
    pub async fn wire_list_keys(&self) -> Result<Vec<Bytes>> {
        let values = self.layout.values();
        let etcd_keys = self
            .call_async("list_keys", |kv| super::keys_under(kv, values.clone()))
            .await?;
        Ok(etcd_keys
            .iter()
            .filter_map(|k| self.layout.raw_key(k).map(Bytes::copy_from_slice))
            .collect())
    }

    /// BARRIER's arrival: adds 1 to the counter under `key` (missing counts from 0) and says
    /// whether this arrival completed it (at least `world_size` arrived).
    pub async fn wire_barrier_arrive(&self, key: &[u8], world_size: i64) -> Result<bool> {
        let arrived = self
            .update_async("barrier", self.layout.value(key), |current| {
                let now = current.map_or(Ok(0), |value| counter(key, value))?;
                let arrived = now.wrapping_add(1).to_string().into_bytes();
                Ok(Change::Put(arrived.clone(), arrived))
            })
            .await?;
        Ok(counter(key, &arrived)? >= world_size)
    }

    /// Returns once the counter under `key` is at least `target` (a read, then a watch of the
    /// key from that read's revision; a broken watch reads again). Runs until then.
    pub async fn wire_counter_at_least(&self, key: &[u8], target: i64) -> Result<()> {
        let etcd_key = self.layout.value(key);
        let reached = |value: &[u8]| counter(key, value).is_ok_and(|n| n >= target);
        loop {
            let (value, revision) = self.read_at("barrier", &etcd_key).await?;
            if value.as_deref().is_some_and(reached) {
                return Ok(());
            }
            let options = WatchOptions::new().with_start_revision(revision + 1);
            let mut client = self.shared.client.watch_client();
            let watched = async {
                let mut stream = client.watch(etcd_key.clone(), Some(options)).await?;
                while let Some(response) = stream.message().await? {
                    if response.canceled() {
                        break;
                    }
                    let put_reaching = response.events().iter().any(|event| {
                        event.event_type() == EventType::Put
                            && event.kv().is_some_and(|kv| reached(kv.value()))
                    });
                    if put_reaching {
                        return Ok(true);
                    }
                }
                Ok::<bool, etcd_client::Error>(false)
            };
            match watched.await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(err) if is_transient(&err) => {}
                Err(err) => return Err(fatal("barrier", err)),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// The pairs without the ones a later pair of the same key overwrites, in order: what applying
/// every pair in order leaves, one write per key.
fn last_writes<K: Eq + std::hash::Hash, V>(pairs: impl Iterator<Item = (K, V)>) -> Vec<(K, V)> {
    let pairs: Vec<(K, V)> = pairs.collect();
    let mut last = std::collections::HashMap::with_capacity(pairs.len());
    for (i, (key, _)) in pairs.iter().enumerate() {
        last.insert(key, i);
    }
    let keep: Vec<bool> = (0..pairs.len())
        .map(|i| last.get(&pairs[i].0) == Some(&i))
        .collect();
    pairs
        .into_iter()
        .zip(keep)
        .filter_map(|(pair, kept)| kept.then_some(pair))
        .collect()
}
