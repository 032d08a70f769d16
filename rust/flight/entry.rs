//! One recorded op: what it was (group, sequence number, op, tensor metadata, call site) and
//! how far it got (issued, started, completed, failed) with the time of each step.
//!
//! Kept apart from the ring so that summaries, dumps and the diagnosis share one type, and the
//! JSON a rank publishes is the JSON another rank (or the doctor) reads back.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How far a recorded op got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    /// Called, not yet running on the backend.
    Issued,
    /// Running on the backend (the backend took it).
    Started,
    /// Finished successfully.
    Completed,
    /// Finished with an error (`Entry::error` says which).
    Failed,
}

impl OpState {
    /// Issued or started: the op has not finished.
    pub fn is_pending(self) -> bool {
        matches!(self, OpState::Issued | OpState::Started)
    }

    /// The lower-case name used in JSON and in Python's dicts.
    pub fn as_str(self) -> &'static str {
        match self {
            OpState::Issued => "issued",
            OpState::Started => "started",
            OpState::Completed => "completed",
            OpState::Failed => "failed",
        }
    }
}

/// One collective or point-to-point op as the recorder saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Process-wide id, from 1, in issue order; the handle for `started`/`completed`/`failed`.
    pub id: u64,
    /// The process group's name (`WORLD` for the default group).
    pub group: String,
    /// Per-group sequence number, from 1, assigned by the recorder: the n-th op on this group.
    /// Every rank of the group issues op n as its n-th op there, unless the job has a desync.
    /// Point-to-point ops ([`is_p2p`]) count on a sequence of their own.
    pub seq: u64,
    /// The op (`all_reduce`, `ddp.all_reduce`, `send`, ...).
    pub op: String,
    /// The shape of each tensor argument.
    pub shapes: Vec<Vec<i64>>,
    /// The dtype of each tensor argument (`float32`, ...).
    pub dtypes: Vec<String>,
    /// The reduce op (`SUM`, ...) for reductions.
    pub reduce_op: Option<String>,
    /// Where the user called it (`train.py:88`).
    pub call_site: String,
    /// How far it got.
    pub state: OpState,
    /// When it was issued (unix ms).
    pub issued_at_ms: Option<u64>,
    /// When the backend started it (unix ms).
    pub started_at_ms: Option<u64>,
    /// When it finished, successfully or not (unix ms).
    pub completed_at_ms: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// What an op is (everything but its id, number and progress), in parts shared by reference.
///
/// A job issues the same few ops over and over: its groups, op names, call sites and tensor
/// shapes repeat every step. The ring keeps each op's description as shared references to
/// them, so recording an op copies no string and allocates nothing once its parts have been
/// seen, and dropping the oldest op frees nothing; an owned [`Entry`] is made only when the
/// ring is read (a summary, a dump), which is rare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpDescription {
    /// The process group's name.
    pub group: Arc<str>,
    /// The op.
    pub op: Arc<str>,
    /// Its tensors' shapes and dtypes.
    pub tensors: Arc<TensorMeta>,
    /// The reduce op, for reductions.
    pub reduce_op: Option<Arc<str>>,
    /// Where the user called it.
    pub call_site: Arc<str>,
}

/// The shape and dtype of each tensor argument of an op.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// The shape of each tensor argument.
    pub shapes: Vec<Vec<i64>>,
    /// The dtype of each tensor argument (`float32`, ...).
    pub dtypes: Vec<String>,
}

impl OpDescription {
    /// A description from owned parts (each its own allocation: for callers that record
    /// rarely; the per-op path shares its parts between ops).
    pub fn new(
        group: &str,
        op: &str,
        shapes: Vec<Vec<i64>>,
        dtypes: Vec<String>,
        reduce_op: Option<&str>,
        call_site: &str,
    ) -> Self {
        OpDescription {
            group: group.into(),
            op: op.into(),
            tensors: Arc::new(TensorMeta { shapes, dtypes }),
            reduce_op: reduce_op.map(Arc::from),
            call_site: call_site.into(),
        }
    }
}

/// Now as unix milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// True for point-to-point ops (`send`, `irecv`, `p2p.send`, ...): the recorder numbers
/// them apart from the group's collectives, since only the two peers issue them.
pub fn is_p2p(op: &str) -> bool {
    let base = op.rsplit('.').next().unwrap_or(op);
    matches!(
        base,
        "send"
            | "recv"
            | "isend"
            | "irecv"
            | "batch_isend_irecv"
            | "send_object_list"
            | "recv_object_list"
    )
}
