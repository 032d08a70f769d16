//! Read-modify-write on one etcd key, exactly once even when a reply is lost.
//!
//! `add`, `compare_set`, `append`, `delete_key` and the queue operations read a key, compute
//! its next value and write it back with a compare on the key's `mod_revision`, so concurrent
//! writers never lose each other's updates (a conflict reads again and recomputes).
//!
//! The hard case is a reply that never comes: the member we talked to died, or the attempt timed
//! out. The write may have committed (and a lagging leader may even commit it later), so simply
//! trying again could count an `add` twice or pop two queue elements. So each transaction also
//! writes a *receipt*: the operation's id and its result, in a key only this store handle uses
//! (one per concurrent operation, a "slot"). Every attempt reads the key and the receipt in one
//! snapshot and writes only if neither moved since (two compares), and an attempt that finds its
//! own receipt returns the result recorded there. A late commit of an earlier attempt moves the
//! receipt, so it and a later attempt can never both apply: exactly one write per operation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::retry::retrying;
use super::EtcdStore;
use crate::error::Result;
use crate::store::Deadline;

/// What an operation does with the key it read.
pub enum Change {
    /// Nothing to write; the call returns this result (a failed compare_set, an empty pop).
    Keep(Vec<u8>),
    /// Write this value and return the result.
    Put(Vec<u8>, Vec<u8>),
    /// Delete the key and return the result.
    Delete(Vec<u8>),
}

/// Receipt slots of one store handle: ids for operations and a free list of slots.
pub struct Receipts {
    client: String,
    next_op: AtomicU64,
    free: Mutex<Vec<usize>>,
    slots: AtomicU64,
}

impl Receipts {
    /// Receipts for a new store handle, under a random client id.
    pub fn new() -> Self {
        Receipts {
            client: random_id(),
            next_op: AtomicU64::new(1),
            free: Mutex::new(Vec::new()),
            slots: AtomicU64::new(0),
        }
    }

    fn take_slot(&self) -> Slot<'_> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let slot = reused.unwrap_or_else(|| self.slots.fetch_add(1, Ordering::Relaxed) as usize);
        Slot { owner: self, slot }
    }
}

/// A slot in use by one operation; returned to the free list on drop.
struct Slot<'a> {
    owner: &'a Receipts,
    slot: usize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut free = self.owner.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(self.slot);
    }
}

/// 128 random bits as hex.
fn random_id() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}

fn compare_unchanged(key: &[u8], kv: Option<&KeyValue>) -> Compare {
    match kv {
        Some(kv) => Compare::mod_revision(key.to_vec(), CompareOp::Equal, kv.mod_revision()),
        None => Compare::version(key.to_vec(), CompareOp::Equal, 0),
    }
}

fn first_kv(response: Option<&TxnOpResponse>) -> Option<KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
}

impl EtcdStore {
    /// Applies `change` to etcd key `key` exactly once and returns its result.
    pub(super) async fn read_modify_write(
        &self,
        what: &str,
        key: Vec<u8>,
        deadline: Deadline,
        change: impl Fn(Option<&[u8]>) -> Result<Change>,
    ) -> Result<Vec<u8>> {
        let receipts = &self.shared.receipts;
        let op = receipts.next_op.fetch_add(1, Ordering::Relaxed).to_string();
        let slot = receipts.take_slot();
        let receipt_key = self.layout.receipt(&receipts.client, slot.slot);
        let kv = self.shared.client.kv_client();
        retrying(what, deadline, || {
            let mut kv = kv.clone();
            let (key, receipt_key, op) = (&key, &receipt_key, &op);
            let change = &change;
            async move {
                let reads = || {
                    [
                        TxnOp::get(key.clone(), None),
                        TxnOp::get(receipt_key.clone(), None),
                    ]
                };
                let mut snapshot = kv.txn(Txn::new().and_then(reads())).await?;
                let mut conflicts = 0u32;
                loop {
                    let responses = snapshot.op_responses();
                    let current = first_kv(responses.first());
                    let receipt = first_kv(responses.get(1));
                    if let Some(done) = receipt.as_ref().and_then(|r| recorded(r.value(), op)) {
                        return Ok(Ok(done));
                    }
                    let (write, result) = match change(current.as_ref().map(KeyValue::value)) {
                        Err(err) => return Ok(Err(err)),
                        Ok(Change::Keep(result)) => return Ok(Ok(result)),
                        Ok(Change::Put(value, result)) => {
                            (TxnOp::put(key.clone(), value, None), result)
                        }
                        Ok(Change::Delete(result)) => (TxnOp::delete(key.clone(), None), result),
                    };
                    let mut record = format!("{op}\n").into_bytes();
                    record.extend_from_slice(&result);
                    let txn = Txn::new()
                        .when([
                            compare_unchanged(key, current.as_ref()),
                            compare_unchanged(receipt_key, receipt.as_ref()),
                        ])
                        .and_then([write, TxnOp::put(receipt_key.clone(), record, None)])
                        .or_else(reads());
                    snapshot = kv.txn(txn).await?;
                    if snapshot.succeeded() {
                        return Ok(Ok(result));
                    }
                    // Someone moved the key, or an earlier attempt of ours landed late: the
                    // failed transaction read both again, so decide again from that snapshot,
                    // after a random pause that grows with the conflicts: every attempt costs
                    // a raft commit, and without it N writers of one counter made O(N²).
                    conflicts += 1;
                    tokio::time::sleep(conflict_pause(conflicts)).await;
                }
            }
        })
        .await
    }
}

/// Longest pause after a conflict (the pause is uniform in `0..=cap`, the cap doubling from
/// 1 ms with each conflict of the same call).
const LONGEST_CONFLICT_PAUSE_MS: u64 = 32;

/// A random pause after the `conflicts`-th lost compare-and-swap of one call.
fn conflict_pause(conflicts: u32) -> std::time::Duration {
    let cap = (1u64 << conflicts.min(16)).min(LONGEST_CONFLICT_PAUSE_MS) * 1000;
    std::time::Duration::from_micros(random_u64() % (cap + 1))
}

/// A random number, from the standard library's randomly keyed hasher (each `RandomState` has
/// fresh keys), so no random-number crate is needed for ids and jitter.
fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The result recorded in a receipt, if the receipt is operation `op`'s.
fn recorded(receipt: &[u8], op: &str) -> Option<Vec<u8>> {
    let rest = receipt.strip_prefix(op.as_bytes())?;
    rest.strip_prefix(b"\n").map(<[u8]>::to_vec)
}
