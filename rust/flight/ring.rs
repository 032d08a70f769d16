//! The per-process ring of recent ops: fixed size, thread-safe, cheap enough to be on by
//! default.
//!
//! Every op pays one `record` and one `completed`: a lock, a push into a preallocated ring
//! (the oldest entry is dropped in place when full) and a counter bump. An op is kept as a
//! compact slot whose description ([`OpDescription`]) is shared references to parts that the
//! job's other ops share too, so on a job's steady path a record allocates and frees nothing
//! and touches memory that recent ops have just touched (on a small machine, run between two
//! collectives with cold caches, each allocation and free of a cold block cost the step far
//! more than its time alone: `benches/flight_overhead.py`). Ids are consecutive, so finding an
//! entry by id is an index computation, not a search; ids that are unknown or already
//! overwritten are ignored, because a late completion callback of an op the ring has forgotten
//! is normal.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::fast::RandomState;

use super::entry::{is_p2p, now_ms, Entry, OpDescription, OpState};
use super::summary::{self, RankSummary, Signature, MAX_PENDING, RECENT};

/// The flight recorder of one process: the last `capacity` ops, oldest first.
pub struct Recorder {
    capacity: usize,
    ring: Mutex<Ring>,
}

/// One op in the ring: an [`Entry`] whose strings and shapes are shared.
struct Slot {
    id: u64,
    seq: u64,
    what: OpDescription,
    state: OpState,
    issued_at_ms: Option<u64>,
    started_at_ms: Option<u64>,
    completed_at_ms: Option<u64>,
    error: Option<String>,
}

impl Slot {
    fn to_entry(&self) -> Entry {
        Entry {
            id: self.id,
            group: self.what.group.to_string(),
            seq: self.seq,
            op: self.what.op.to_string(),
            shapes: self.what.tensors.shapes.clone(),
            dtypes: self.what.tensors.dtypes.clone(),
            reduce_op: self.what.reduce_op.as_deref().map(str::to_owned),
            call_site: self.what.call_site.to_string(),
            state: self.state,
            issued_at_ms: self.issued_at_ms,
            started_at_ms: self.started_at_ms,
            completed_at_ms: self.completed_at_ms,
            error: self.error.clone(),
        }
    }
}

struct Ring {
    entries: VecDeque<Slot>,
    /// The id the next `record` gets; ids start at 1.
    next_id: u64,
    /// The last sequence number of a collective issued on each group.
    seqs: HashMap<Arc<str>, u64, RandomState>,
    /// The same for point-to-point ops, which only two ranks of a group issue.
    p2p_seqs: HashMap<Arc<str>, u64, RandomState>,
    /// The id of the op that completed last (0: none yet).
    last_completed_id: u64,
    /// That op, once the ring has dropped it (kept by moving it out, not by copying).
    last_completed_dropped: Option<Slot>,
}

impl Ring {
    /// The next sequence number on `group` for `op` (point-to-point ops count apart).
    fn next_seq(&mut self, group: &Arc<str>, op: &str) -> u64 {
        let seqs = if is_p2p(op) {
            &mut self.p2p_seqs
        } else {
            &mut self.seqs
        };
        match seqs.get_mut(&**group) {
            Some(seq) => {
                *seq += 1;
                *seq
            }
            None => {
                seqs.insert(Arc::clone(group), 1);
                1
            }
        }
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Slot> {
        let first = self.next_id - self.entries.len() as u64;
        if id < first || id >= self.next_id {
            return None;
        }
        self.entries.get_mut((id - first) as usize)
    }

    fn last_completed(&self) -> Option<Entry> {
        if self.last_completed_id == 0 {
            return None;
        }
        let first = self.next_id - self.entries.len() as u64;
        if self.last_completed_id >= first {
            self.entries
                .get((self.last_completed_id - first) as usize)
                .map(Slot::to_entry)
        } else {
            self.last_completed_dropped.as_ref().map(Slot::to_entry)
        }
    }
}

impl Recorder {
    /// A recorder that keeps the last `capacity` ops (0 keeps none but still numbers them).
    pub fn new(capacity: usize) -> Self {
        Recorder {
            capacity,
            ring: Mutex::new(Ring {
                entries: VecDeque::with_capacity(capacity),
                next_id: 1,
                seqs: HashMap::default(),
                p2p_seqs: HashMap::default(),
                last_completed_id: 0,
                last_completed_dropped: None,
            }),
        }
    }

    /// How many ops the ring keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding the lock leaves a consistent ring (every step is one push or
        // one field write), so a poisoned lock is still usable.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an op as issued now; returns its `(id, seq)` (seq: the next on `group`, on the
    /// group's point-to-point sequence for a point-to-point op).
    pub fn record(
        &self,
        group: &str,
        op: String,
        shapes: Vec<Vec<i64>>,
        dtypes: Vec<String>,
        reduce_op: Option<String>,
        call_site: String,
    ) -> (u64, u64) {
        self.record_op(OpDescription::new(
            group,
            &op,
            shapes,
            dtypes,
            reduce_op.as_deref(),
            &call_site,
        ))
    }

    /// [`Recorder::record`] for an op described by shared parts: the per-op path, which
    /// allocates nothing once the ring is full.
    pub fn record_op(&self, what: OpDescription) -> (u64, u64) {
        let issued_at = now_ms();
        let mut ring = self.lock();
        let seq = ring.next_seq(&what.group, &what.op);
        let id = ring.next_id;
        ring.next_id += 1;
        if self.capacity == 0 {
            return (id, seq);
        }
        if ring.entries.len() == self.capacity {
            if let Some(old) = ring.entries.pop_front() {
                if old.id == ring.last_completed_id {
                    ring.last_completed_dropped = Some(old);
                }
            }
        }
        ring.entries.push_back(Slot {
            id,
            seq,
            what,
            state: OpState::Issued,
            issued_at_ms: Some(issued_at),
            started_at_ms: None,
            completed_at_ms: None,
            error: None,
        });
        (id, seq)
    }

    /// The backend started op `id`.
    pub fn started(&self, id: u64) {
        let at = now_ms();
        if let Some(entry) = self.lock().get_mut(id) {
            if entry.state == OpState::Issued {
                entry.state = OpState::Started;
                entry.started_at_ms = Some(at);
            }
        }
    }

    /// Op `id` finished successfully.
    pub fn completed(&self, id: u64) {
        let at = now_ms();
        let mut ring = self.lock();
        if let Some(entry) = ring.get_mut(id) {
            if entry.state.is_pending() {
                entry.state = OpState::Completed;
                entry.completed_at_ms = Some(at);
                ring.last_completed_id = id;
            }
        }
    }

    /// Op `id`, recorded on a stand-in group because its group was not known when it was
    /// issued (a receive from any source, on `...:p2p:any->R`), turned out to be on `group` as
    /// `op`: it moves there and takes that group's next sequence number, so that the group's
    /// numbering stays the one its other member keeps. The number is taken even when the ring
    /// has already dropped the op. Returns the new sequence number.
    pub fn moved(&self, id: u64, group: &str, op: &str) -> u64 {
        let group: Arc<str> = group.into();
        let mut ring = self.lock();
        let seq = ring.next_seq(&group, op);
        if let Some(entry) = ring.get_mut(id) {
            entry.what.group = group;
            entry.what.op = op.into();
            entry.seq = seq;
        }
        seq
    }

    /// Op `id` failed because of `why`.
    pub fn failed(&self, id: u64, why: &str) {
        let at = now_ms();
        if let Some(entry) = self.lock().get_mut(id) {
            if entry.state.is_pending() {
                entry.state = OpState::Failed;
                entry.completed_at_ms = Some(at);
                entry.error = Some(why.to_string());
            }
        }
    }

    /// A copy of the ring, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        self.lock().entries.iter().map(Slot::to_entry).collect()
    }

    /// This rank's compact summary, with `now_ms` as its heartbeat.
    pub fn summary(&self, rank: usize, now_ms: u64) -> RankSummary {
        let ring = self.lock();
        let last_seq: BTreeMap<String, u64> =
            ring.seqs.iter().map(|(g, s)| (g.to_string(), *s)).collect();
        // Only the few ops a summary holds are made into entries.
        let pending = ring
            .entries
            .iter()
            .filter(|e| e.state.is_pending())
            .take(MAX_PENDING)
            .map(Slot::to_entry)
            .collect();
        let skip = ring.entries.len().saturating_sub(RECENT);
        let recent = ring
            .entries
            .iter()
            .skip(skip)
            .map(|e| Signature::of(&e.to_entry()))
            .collect();
        summary::assemble(
            rank,
            now_ms,
            summary::Origin::this_process(),
            pending,
            recent,
            ring.last_completed(),
            last_seq,
        )
    }
}
