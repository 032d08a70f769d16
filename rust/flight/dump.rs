//! The dump file: a rank's whole ring, written on a timeout, on `SIGUSR1` or on request, and
//! read back by `python -m ferrodist.doctor`.
//!
//! The format is named and versioned (`"format": "ferrodist-flight-recorder"`, `"version": 1`)
//! so that a tool can tell a dump from any other JSON, and a reader refuses a version it does
//! not know instead of misreading it. A directory of dumps (one per rank) is diagnosed like
//! live summaries, through [`RankSummary::from_dump`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::entry::{is_p2p, Entry, OpState};
use super::ring::Recorder;
use super::summary::{self, Origin, RankSummary};
use crate::{Error, Result};

/// The `format` field of every dump.
pub const DUMP_FORMAT: &str = "ferrodist-flight-recorder";
/// The dump version this build writes and reads.
pub const DUMP_VERSION: u32 = 1;

/// One rank's dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    /// Always [`DUMP_FORMAT`].
    pub format: String,
    /// Always [`DUMP_VERSION`].
    pub version: u32,
    /// The rank in the default group.
    pub rank: usize,
    /// The size of the default group.
    pub world_size: usize,
    /// The process id.
    pub pid: u32,
    /// The host name.
    pub host: String,
    /// When it was written (unix ms).
    pub dumped_at_ms: u64,
    /// Why (`timeout`, `SIGUSR1`, `manual`, ...).
    pub reason: String,
    /// The ring, oldest first.
    pub entries: Vec<Entry>,
}

impl Dump {
    /// This process's dump of `recorder` now.
    pub fn of(
        recorder: &Recorder,
        rank: usize,
        world_size: usize,
        reason: &str,
        now_ms: u64,
    ) -> Self {
        let origin = Origin::this_process();
        Dump {
            format: DUMP_FORMAT.to_string(),
            version: DUMP_VERSION,
            rank,
            world_size,
            pid: origin.pid,
            host: origin.host,
            dumped_at_ms: now_ms,
            reason: reason.to_string(),
            entries: recorder.entries(),
        }
    }

    /// The file's text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a dump always serializes")
    }

    /// Reads a dump; refuses another format or version with [`Error::InvalidArgument`].
    pub fn from_json(text: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("flight recorder dump: {why}"));
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let format = value.get("format").and_then(|f| f.as_str());
        if format != Some(DUMP_FORMAT) {
            return Err(bad(format!(
                "format is {}, expected \"{DUMP_FORMAT}\"",
                format.map_or("missing".to_string(), |f| format!("{f:?}"))
            )));
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(DUMP_VERSION) => {}
            other => {
                return Err(bad(format!(
                    "version {} is not supported (this ferrodist reads version {DUMP_VERSION})",
                    other.map_or("(none)".to_string(), |v| v.to_string())
                )))
            }
        }
        serde_json::from_value(value).map_err(|e| bad(e.to_string()))
    }

    /// Writes the dump to `path` atomically (a temporary file renamed over it), so that a
    /// reader never sees half a dump.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_json())?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    /// Reads the dump at `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)?;
        Self::from_json(&text).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", path.display())),
            other => other,
        })
    }
}

impl RankSummary {
    /// The summary the dumped rank would have published when it wrote the dump (its heartbeat
    /// is the dump's time).
    pub fn from_dump(dump: &Dump) -> Self {
        let mut last_seq = BTreeMap::new();
        for e in dump.entries.iter().filter(|e| !is_p2p(&e.op)) {
            let seq = last_seq.entry(e.group.clone()).or_insert(0);
            *seq = (*seq).max(e.seq);
        }
        let last_completed = dump
            .entries
            .iter()
            .filter(|e| e.state == OpState::Completed)
            .max_by_key(|e| (e.completed_at_ms, e.id))
            .cloned();
        summary::build(
            dump.rank,
            dump.dumped_at_ms,
            Origin {
                pid: dump.pid,
                host: dump.host.clone(),
            },
            dump.entries.iter(),
            last_completed,
            last_seq,
        )
    }
}
