//! A rank's compact summary: what the other ranks (or the doctor) need to explain a hang, small
//! enough to publish to the job's store every few seconds.
//!
//! The whole ring would be thousands of entries; a diagnosis needs only the op this rank last
//! completed, the ops it still waits in, the last sequence number it issued on each group (who
//! has not reached an op yet) and the signatures of its latest ops (where ranks diverged).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::entry::Entry;
use crate::{Error, Result};

/// The summary format this build writes and reads.
pub const SUMMARY_VERSION: u32 = 1;
/// At most this many pending ops, oldest first.
pub const MAX_PENDING: usize = 8;
/// The signatures of this many latest ops.
pub const RECENT: usize = 64;

/// What identifies an op across ranks: every rank issues the same op under one (group, seq).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The process group's name.
    pub group: String,
    /// Per-group sequence number.
    pub seq: u64,
    /// The op.
    pub op: String,
    /// The shape of each tensor argument.
    pub shapes: Vec<Vec<i64>>,
    /// The dtype of each tensor argument.
    pub dtypes: Vec<String>,
    /// The reduce op, for reductions.
    pub reduce_op: Option<String>,
    /// Where the user called it.
    pub call_site: String,
}

impl Signature {
    /// The signature of a recorded op.
    pub fn of(entry: &Entry) -> Self {
        Signature {
            group: entry.group.clone(),
            seq: entry.seq,
            op: entry.op.clone(),
            shapes: entry.shapes.clone(),
            dtypes: entry.dtypes.clone(),
            reduce_op: entry.reduce_op.clone(),
            call_site: entry.call_site.clone(),
        }
    }

    /// True when both describe the same op (the call site may differ between ranks).
    pub fn same_op(&self, other: &Signature) -> bool {
        self.op == other.op
            && self.shapes == other.shapes
            && self.dtypes == other.dtypes
            && self.reduce_op == other.reduce_op
    }
}

/// One rank's summary, as published to the store and read by [`super::diagnose()`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSummary {
    /// Always [`SUMMARY_VERSION`].
    pub version: u32,
    /// The rank in the default group.
    pub rank: usize,
    /// The process id.
    pub pid: u32,
    /// The host name.
    pub host: String,
    /// When the summary was made (unix ms): the rank was alive then.
    pub heartbeat_ms: u64,
    /// The op that completed last.
    pub last_completed: Option<Entry>,
    /// Ops issued or started and not finished, oldest first, at most [`MAX_PENDING`].
    pub pending: Vec<Entry>,
    /// The signatures of the latest [`RECENT`] ops, oldest first.
    pub recent: Vec<Signature>,
    /// The last sequence number of a collective issued on each group (a group absent: none
    /// issued there). Not in the contract's first draft; a summary without it is still read.
    #[serde(default)]
    pub last_seq: BTreeMap<String, u64>,
}

/// Which process a summary comes from.
pub(crate) struct Origin {
    pub pid: u32,
    pub host: String,
}

impl Origin {
    /// This process.
    pub fn this_process() -> Self {
        Origin {
            pid: std::process::id(),
            host: hostname().to_string(),
        }
    }
}

/// This host's name ("" when the OS will not say), looked up once.
fn hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it
        // or truncates, and we stop at the first NUL or the end.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc != 0 {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    })
}

/// Builds a summary from entries oldest first (a dump's entries).
pub(crate) fn build<'a, I>(
    rank: usize,
    heartbeat_ms: u64,
    origin: Origin,
    entries: I,
    last_completed: Option<Entry>,
    last_seq: BTreeMap<String, u64>,
) -> RankSummary
where
    I: IntoIterator<Item = &'a Entry>,
    I::IntoIter: DoubleEndedIterator + Clone,
{
    let entries = entries.into_iter();
    let pending = entries
        .clone()
        .filter(|e| e.state.is_pending())
        .take(MAX_PENDING)
        .cloned()
        .collect();
    let mut recent: Vec<Signature> = entries.rev().take(RECENT).map(Signature::of).collect();
    recent.reverse();
    assemble(
        rank,
        heartbeat_ms,
        origin,
        pending,
        recent,
        last_completed,
        last_seq,
    )
}

/// A summary from its parts: `pending` (at most [`MAX_PENDING`]) and `recent` (at most
/// [`RECENT`]), each oldest first.
pub(crate) fn assemble(
    rank: usize,
    heartbeat_ms: u64,
    origin: Origin,
    pending: Vec<Entry>,
    recent: Vec<Signature>,
    last_completed: Option<Entry>,
    last_seq: BTreeMap<String, u64>,
) -> RankSummary {
    RankSummary {
        version: SUMMARY_VERSION,
        rank,
        pid: origin.pid,
        host: origin.host,
        heartbeat_ms,
        last_completed,
        pending,
        recent,
        last_seq,
    }
}

impl RankSummary {
    /// The JSON form published to the store.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a summary always serializes")
    }

    /// Reads a summary; refuses one of another version or that is not a summary.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("flight recorder summary: {e}")))?;
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(SUMMARY_VERSION) => {}
            other => {
                return Err(Error::InvalidArgument(format!(
                    "flight recorder summary version {} is not supported (this ferrodist \
                     reads version {SUMMARY_VERSION})",
                    other.map_or("(none)".to_string(), |v| v.to_string())
                )))
            }
        }
        serde_json::from_value(value)
            .map_err(|e| Error::InvalidArgument(format!("flight recorder summary: {e}")))
    }
}
