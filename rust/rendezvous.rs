//! Rendezvous join: every rank announces itself on a shared store and waits for the others,
//! with progress reports that say who is missing at the cost of one request each.
//!
//! Keys, under the caller's prefix (which ferrodist's Python layer makes unique per torchelastic
//! restart):
//!
//! * the roll ([`enroll`]): each arriving rank enrolls itself and learns how many
//!   ranks have, so exactly the rank that completes it knows it is last, and one read lists
//!   every rank that came. On ferrodist's TCP, hash and file stores that is an append to
//!   `joined` and an add to `count`, each one atomic step on the server; on etcd a key per rank
//!   and a count of the roll in the same transaction (a shared key there is a compare-and-swap
//!   that every rank contends for: O(n²) raft commits, and no 1024-rank rendezvous in 120 s);
//! * `done`: set by the rank that completes the roll; what every other rank waits on.
//!
//! A prompt rendezvous therefore costs two or three requests per rank (enroll, wait). A slow one
//! costs one more read of the roll per report, however large the world: an earlier version
//! sent a `check` per rank from every waiting rank every report (16.7 M requests per report at
//! 4,096 ranks, just when start-up is slowest). A timeout names the ranks that never came.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::store::{blocking, Deadline, Interrupt, Store};

/// How long [`enrolled`] waits for a roll's list (its caller has enrolled, so the list exists
/// unless the store lost it).
const ROLL_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Adds `member` to the roll named `roll` and returns how many members it counts, this one
/// included; of the callers that bring it to `n` members, at least one sees `n`.
///
/// The store's own rolls where it has them ([`Store::roll`]: EtcdStore), else an append of
/// `"{member},"` to `{roll}joined` and an add of 1 to `{roll}count` (each atomic on ferrodist's
/// stores, so two requests per member).
pub fn enroll(store: &dyn Store, roll: &str, member: usize) -> Result<usize> {
    if let Some(native) = store.roll() {
        return native.enroll(roll, member);
    }
    store.append(&format!("{roll}joined"), format!("{member},").as_bytes())?;
    let count = store.add(&format!("{roll}count"), 1)?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// The members of roll `roll` so far, in any order (see [`enroll`]): one request.
pub fn enrolled(store: &dyn Store, roll: &str) -> Result<Vec<usize>> {
    if let Some(native) = store.roll() {
        return native.enrolled(roll);
    }
    let listed = store.get_timeout(&format!("{roll}joined"), ROLL_READ_TIMEOUT)?;
    Ok(String::from_utf8_lossy(&listed)
        .split(',')
        .filter_map(|m| m.trim().parse().ok())
        .collect())
}

/// Who has joined a rendezvous that is still waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Ranks that have arrived, ascending.
    pub joined: Vec<usize>,
    /// Ranks still missing, ascending.
    pub missing: Vec<usize>,
    /// Time since this rank arrived.
    pub waited: Duration,
}

impl Progress {
    /// `"2/4 ranks joined [0, 2]; missing ranks: [1, 3]"`, runs of three or more ranks written
    /// as ranges (`[1-511]`), so a report stays one readable line at any world size.
    pub fn describe(&self) -> String {
        let world = self.joined.len() + self.missing.len();
        format!(
            "{}/{world} ranks joined {}; missing ranks: {}",
            self.joined.len(),
            ranges(&self.joined),
            ranges(&self.missing)
        )
    }
}

/// Ascending ranks as a list with runs of three or more collapsed: `[0, 2, 5-9]`.
fn ranges(ranks: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            parts.extend(ranks[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    format!("[{}]", parts.join(", "))
}

/// One rank's part in a rendezvous, from its arrival until every rank has come.
pub struct Join {
    store: Arc<dyn Store>,
    roll: String,
    done_key: String,
    world_size: usize,
    started: Instant,
    deadline: Deadline,
    timeout: Duration,
}

impl Join {
    /// Announces `rank` under `prefix` on `store`. The returned flag is true when this arrival
    /// completed the rendezvous (nothing is left to wait for).
    pub fn arrive(
        store: Arc<dyn Store>,
        prefix: &str,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<(Join, bool)> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range for world_size {world_size}"
            )));
        }
        let join = Join {
            roll: prefix.to_owned(),
            done_key: format!("{prefix}done"),
            world_size,
            started: Instant::now(),
            deadline: Deadline::after(timeout),
            timeout,
            store,
        };
        let arrived = enroll(&*join.store, &join.roll, rank)?;
        let complete = arrived >= world_size;
        if complete {
            join.store.set(&join.done_key, b"1")?;
        }
        Ok((join, complete))
    }

    /// Waits up to `report_every` (less if the timeout comes first) for the last rank.
    /// `Ok(None)`: every rank has joined. `Ok(Some(progress))`: some are still missing and the
    /// timeout has not passed. Past the timeout: a timeout error naming the missing ranks.
    /// `interrupted` is called between short slices of the wait (Ctrl-C in Python).
    pub fn wait(
        &self,
        report_every: Duration,
        interrupted: Interrupt<'_>,
    ) -> Result<Option<Progress>> {
        let slice = match self.deadline.remaining() {
            Some(left) => report_every.min(left).max(Duration::from_millis(1)),
            None => report_every,
        };
        let keys = [self.done_key.clone()];
        match blocking::wait(&*self.store, &keys, slice, interrupted) {
            Ok(()) => return Ok(None),
            Err(err) if err.is_timeout() => {}
            Err(err) => return Err(err),
        }
        let progress = self.progress()?;
        if progress.missing.is_empty() {
            return Ok(None); // the last rank came between the wait and the look
        }
        if self.deadline.expired() {
            return Err(Error::Timeout {
                op: "rendezvous".into(),
                after: self.timeout,
                detail: format!(
                    "waited {:.1}s: {}",
                    progress.waited.as_secs_f64(),
                    progress.describe()
                ),
            });
        }
        Ok(Some(progress))
    }

    /// Who has joined so far: one read of the roll.
    pub fn progress(&self) -> Result<Progress> {
        let mut present = vec![false; self.world_size];
        for rank in enrolled(&*self.store, &self.roll)? {
            if rank < self.world_size {
                present[rank] = true;
            }
        }
        let (joined, missing) = (0..self.world_size).partition(|&r| present[r]);
        Ok(Progress {
            joined,
            missing,
            waited: self.started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;

    fn never_interrupted() -> Result<()> {
        Ok(())
    }

    #[test]
    fn the_last_arrival_completes_and_releases_the_others() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let timeout = Duration::from_secs(10);
        let (first, done) = Join::arrive(store.clone(), "r/", 1, 2, timeout).unwrap();
        assert!(!done);
        let (_, done) = Join::arrive(store.clone(), "r/", 0, 2, timeout).unwrap();
        assert!(done);
        let outcome = first.wait(Duration::from_secs(5), &mut never_interrupted);
        assert_eq!(outcome.unwrap(), None);
    }

    #[test]
    fn a_report_lists_who_came_and_a_timeout_names_who_did_not() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let timeout = Duration::from_millis(300);
        let (join, _) = Join::arrive(store.clone(), "r/", 2, 4, timeout).unwrap();
        Join::arrive(store.clone(), "r/", 0, 4, timeout).unwrap();
        let report = join.wait(Duration::from_millis(50), &mut never_interrupted);
        let progress = report.unwrap().expect("still waiting");
        assert_eq!(
            (progress.joined, progress.missing),
            (vec![0, 2], vec![1, 3])
        );
        let err = loop {
            match join.wait(Duration::from_millis(50), &mut never_interrupted) {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("nobody else came"),
                Err(err) => break err,
            }
        };
        assert!(err.is_timeout());
        let text = err.to_string();
        assert!(
            text.contains("2/4 ranks joined [0, 2]; missing ranks: [1, 3]"),
            "{text}"
        );
    }

    /// One request per report, whatever the world size.
    #[test]
    fn a_report_reads_one_key() {
        let store = Arc::new(HashStore::new());
        let (join, _) = Join::arrive(store.clone(), "r/", 0, 4096, Duration::ZERO).unwrap();
        let progress = join.progress().unwrap();
        assert_eq!(progress.joined, vec![0]);
        assert_eq!(progress.missing.len(), 4095);
        assert_eq!(
            store.num_keys().unwrap(),
            2,
            "joined and count: no key per rank"
        );
    }

    #[test]
    fn long_runs_of_ranks_read_as_ranges() {
        assert_eq!(ranges(&[]), "[]");
        assert_eq!(ranges(&[1, 3]), "[1, 3]");
        assert_eq!(ranges(&[0, 1, 4, 5, 6, 7, 9]), "[0, 1, 4-7, 9]");
        let progress = Progress {
            joined: vec![0],
            missing: (1..4096).collect(),
            waited: Duration::ZERO,
        };
        assert_eq!(
            progress.describe(),
            "1/4096 ranks joined [0]; missing ranks: [1-4095]"
        );
    }

    #[test]
    fn a_rank_outside_the_world_is_refused() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        assert!(Join::arrive(store, "r/", 4, 4, Duration::ZERO).is_err());
    }
}
