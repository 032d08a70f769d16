//! Control-plane collectives over a key/value store: torch's `_StoreCollectives`.
//!
//! Ranks exchange small messages (addresses, counters, "I'm done") through any [`Store`]. The
//! key layout is torch's, key for key, so ranks running torch's `_StoreCollectives` and ranks
//! running this one take part in the same collective on one store:
//!
//! | op | writes | reads / waits |
//! |---|---|---|
//! | barrier `K` | `add K/num_members`, `K/<r>` = `joined`, last rank: `K/last_members` | `K/last_members` |
//! | broadcast `K` | root: `K` | `K` |
//! | gather `K` | senders: `K/<r>` | root: `K/<i>`, i != root |
//! | scatter `K` | root: `K/<i>`, i != root | `K/<r>` |
//! | all_gather `K` | `K/<r>` | `K/<i>` |
//! | all_sum `K` | `add K` | barrier `K/barrier`, then `add K 0` |
//!
//! Where it differs from torch, on purpose:
//!
//! * **One deadline per call.** The caller's timeout covers the whole collective (torch applies
//!   it to each store operation, and does so by mutating the shared store's timeout).
//! * **Fewer round trips.** A gather waits once for all keys and reads them with one
//!   `multi_get`; the last rank of a barrier writes its marker and the release key together;
//!   `all_gather` does not read its own value back.
//! * **No race between timeout and late arrival.** When the wait times out, the keys are
//!   checked once more: if everyone arrived meanwhile the collective succeeds; otherwise the
//!   error names exactly the ranks still missing ([`Error::RanksMissing`]).
//! * **Sends keep their timeout too.** A send returns within its timeout (torch bounds each
//!   of its store operations by it); a write the store has not taken by then fails the send.
//! * **Validated input.** A rank outside the world or a scatter list of the wrong length is
//!   an error (torch reads out of bounds or ignores the surplus).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
pub use crate::store::Interrupt;
use crate::store::{blocking, Deadline, Store};

/// Value of a barrier member's marker key, as torch writes it.
const JOINED: &[u8] = b"joined";
/// Value of the key that releases a barrier, as torch writes it.
const RELEASED: &[u8] = b"<val_ignored>";

/// Control collectives for one rank of `world_size` ranks over a shared store.
pub struct StoreCollectives {
    store: Arc<dyn Store>,
    rank: usize,
    world_size: usize,
    used_keys: Mutex<HashSet<String>>,
}

impl StoreCollectives {
    /// Collectives for `rank` (in `0..world_size`) over `store`.
    pub fn new(store: Arc<dyn Store>, rank: i64, world_size: i64) -> Result<Self> {
        if world_size < 1 {
            return Err(Error::InvalidArgument(format!(
                "world_size must be at least 1, got {world_size}"
            )));
        }
        if rank < 0 || rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "rank must be in [0, {world_size}), got {rank}"
            )));
        }
        Ok(StoreCollectives {
            store,
            rank: rank as usize,
            world_size: world_size as usize,
            used_keys: Mutex::new(HashSet::new()),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Records `keys` as used by this instance; fails (recording none) if any was used before.
    /// A failed collective still consumes its key, as in torch.
    fn claim(&self, keys: &[&str]) -> Result<()> {
        let mut used = self.used_keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reused) = keys.iter().find(|k| used.contains(**k)) {
            return Err(Error::InvalidArgument(format!(
                "Key {reused} has already been used."
            )));
        }
        used.extend(keys.iter().map(|k| k.to_string()));
        Ok(())
    }

    fn member_key(key: &str, rank: usize) -> String {
        format!("{key}/{rank}")
    }

    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.world_size).filter(move |&i| i != self.rank)
    }

    /// Blocks until every rank has reached barrier `key` (or, with `block` false, just
    /// announces this rank and returns).
    pub fn barrier(
        &self,
        key: &str,
        timeout: Duration,
        block: bool,
        interrupt: Interrupt<'_>,
    ) -> Result<()> {
        self.claim(&[key])?;
        self.barrier_unclaimed(key, Deadline::after(timeout), block, interrupt)
    }

    fn barrier_unclaimed(
        &self,
        key: &str,
        deadline: Deadline,
        block: bool,
        interrupt: Interrupt<'_>,
    ) -> Result<()> {
        let arrived = self.store.add(&format!("{key}/num_members"), 1)?;
        let marker = Self::member_key(key, self.rank);
        let release = format!("{key}/last_members");
        if arrived == self.world_size as i64 {
            return self
                .store
                .multi_set(&[marker, release], &[JOINED.to_vec(), RELEASED.to_vec()]);
        }
        self.store.set(&marker, JOINED)?;
        if !block {
            return Ok(());
        }
        self.wait_for_ranks("barrier", key, &[release], deadline, interrupt)
    }

    /// Root: publishes `data` under `key` for every other rank, failing if the store has not
    /// taken it within `timeout`.
    pub fn broadcast_send(&self, key: &str, data: &[u8], timeout: Duration) -> Result<()> {
        self.claim(&[key])?;
        let (owned, data) = (key.to_owned(), data.to_vec());
        self.write_within("broadcast_send", key, timeout, move |store| {
            store.set(&owned, &data)
        })
    }

    /// Non-root: the value the root published under `key`.
    pub fn broadcast_recv(
        &self,
        key: &str,
        timeout: Duration,
        interrupt: Interrupt<'_>,
    ) -> Result<Vec<u8>> {
        self.claim(&[key])?;
        blocking::get(&*self.store, key, timeout, interrupt)
    }

    /// Non-root: contributes `data` to the gather `key`, failing if the store has not taken it
    /// within `timeout`.
    pub fn gather_send(&self, key: &str, data: &[u8], timeout: Duration) -> Result<()> {
        self.claim(&[key])?;
        let (own, data) = (Self::member_key(key, self.rank), data.to_vec());
        self.write_within("gather_send", key, timeout, move |store| {
            store.set(&own, &data)
        })
    }

    /// Root: every rank's contribution in rank order, its own `data` at its own position.
    pub fn gather_recv(
        &self,
        key: &str,
        data: &[u8],
        timeout: Duration,
        interrupt: Interrupt<'_>,
    ) -> Result<Vec<Vec<u8>>> {
        self.claim(&[key])?;
        let keys: Vec<String> = self.others().map(|i| Self::member_key(key, i)).collect();
        let mut values =
            self.wait_and_get("gather", key, &keys, Deadline::after(timeout), interrupt)?;
        values.insert(self.rank, data.to_vec());
        Ok(values)
    }

    /// Root: hands element `i` of `data` to rank `i`, failing if the store has not taken them
    /// within `timeout`; returns its own element.
    pub fn scatter_send(&self, key: &str, data: &[Vec<u8>], timeout: Duration) -> Result<Vec<u8>> {
        if data.len() != self.world_size {
            return Err(Error::InvalidArgument(format!(
                "data: scatter_send needs one entry per rank ({}), got {}",
                self.world_size,
                data.len()
            )));
        }
        self.claim(&[key])?;
        let keys: Vec<String> = self.others().map(|i| Self::member_key(key, i)).collect();
        let values: Vec<Vec<u8>> = self.others().map(|i| data[i].clone()).collect();
        if !keys.is_empty() {
            self.write_within("scatter_send", key, timeout, move |store| {
                store.multi_set(&keys, &values)
            })?;
        }
        Ok(data[self.rank].clone())
    }

    /// Non-root: this rank's element of the scatter `key`.
    pub fn scatter_recv(
        &self,
        key: &str,
        timeout: Duration,
        interrupt: Interrupt<'_>,
    ) -> Result<Vec<u8>> {
        self.claim(&[key])?;
        let own = Self::member_key(key, self.rank);
        blocking::get(&*self.store, &own, timeout, interrupt)
    }

    /// Every rank's `data`, in rank order.
    pub fn all_gather(
        &self,
        key: &str,
        data: &[u8],
        timeout: Duration,
        interrupt: Interrupt<'_>,
    ) -> Result<Vec<Vec<u8>>> {
        self.claim(&[key])?;
        let deadline = Deadline::after(timeout);
        self.store.set(&Self::member_key(key, self.rank), data)?;
        let keys: Vec<String> = self.others().map(|i| Self::member_key(key, i)).collect();
        let mut values = self.wait_and_get("all_gather", key, &keys, deadline, interrupt)?;
        values.insert(self.rank, data.to_vec());
        Ok(values)
    }

    /// The sum of every rank's `value`. Uses `key` as the running sum and `key/barrier`.
    pub fn all_sum(
        &self,
        key: &str,
        value: i64,
        timeout: Duration,
        interrupt: Interrupt<'_>,
    ) -> Result<i64> {
        let barrier = format!("{key}/barrier");
        self.claim(&[key, &barrier])?;
        let deadline = Deadline::after(timeout);
        self.store.add(key, value)?;
        self.barrier_unclaimed(&barrier, deadline, true, interrupt)?;
        self.store.add(key, 0)
    }

    /// Runs a send's store write so that the call returns within `timeout` (zero: no limit), as
    /// torch bounds each store operation of a collective by its timeout. A write still running
    /// then fails the send with [`Error::Timeout`]; it may yet land, since no store can cancel
    /// a write. The write runs on a helper thread only when a limit applies and the store's
    /// own write deadline (its timeout, for every native store) is not already within it.
    fn write_within(
        &self,
        op: &str,
        key: &str,
        timeout: Duration,
        write: impl FnOnce(&dyn Store) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let own = self.store.timeout();
        let bounded = self.store.capabilities().bounded_writes && !own.is_zero() && own <= timeout;
        if timeout.is_zero() || bounded {
            return write(&*self.store);
        }
        let (done, result) = std::sync::mpsc::channel();
        let store = Arc::clone(&self.store);
        std::thread::Builder::new()
            .name("ferrodist-send".into())
            .spawn(move || {
                let _ = done.send(write(&*store));
            })?;
        result.recv_timeout(timeout).unwrap_or_else(|_| {
            Err(Error::Timeout {
                op: op.to_string(),
                after: timeout,
                detail: format!("key: {key}, the store did not take the write in time"),
            })
        })
    }

    /// Waits for `keys` then reads them in one `multi_get`, naming missing ranks on timeout.
    fn wait_and_get(
        &self,
        op: &str,
        key: &str,
        keys: &[String],
        deadline: Deadline,
        interrupt: Interrupt<'_>,
    ) -> Result<Vec<Vec<u8>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.wait_for_ranks(op, key, keys, deadline, interrupt)?;
        self.store.multi_get(keys)
    }

    /// Waits until `keys` exist or `deadline` passes. On timeout checks once more, so a rank
    /// arriving at the last moment still counts; if some are still absent, fails naming the
    /// ranks whose `key/<i>` is missing.
    fn wait_for_ranks(
        &self,
        op: &str,
        key: &str,
        keys: &[String],
        deadline: Deadline,
        interrupt: Interrupt<'_>,
    ) -> Result<()> {
        let waited = blocking::wait(&*self.store, keys, time_left(&deadline), interrupt);
        match waited {
            Err(err) if err.is_timeout() => {
                if self.store.check(keys)? {
                    return Ok(());
                }
                let mut missing = Vec::new();
                for i in self.others() {
                    if !self.store.check(&[Self::member_key(key, i)])? {
                        missing.push(i);
                    }
                }
                let mut absent = Vec::new();
                for k in keys {
                    if !self.store.check(std::slice::from_ref(k))? {
                        absent.push(k.clone());
                    }
                }
                if absent.is_empty() {
                    return Ok(());
                }
                Err(Error::RanksMissing {
                    op: op.to_string(),
                    missing,
                    after: deadline.timeout(),
                    keys: absent,
                })
            }
            other => other,
        }
    }
}

/// What is left of `deadline` as a store timeout: zero means "no deadline" to a store, so a
/// passed deadline becomes the shortest real wait instead.
fn time_left(deadline: &Deadline) -> Duration {
    match deadline.remaining() {
        None => Duration::ZERO,
        Some(left) => left.max(Duration::from_millis(1)),
    }
}
