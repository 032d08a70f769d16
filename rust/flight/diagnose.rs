//! From every rank's summary to the sentence a person needs: who is behind, who diverged,
//! who is gone.
//!
//! * **behind**: on each group, the oldest op that some ranks wait in; the group's ranks that
//!   have not issued it yet are the ones everybody waits for. A rank is in a group when it has
//!   issued anything there; every rank is in `WORLD`, both ranks of a point-to-point channel are
//!   in it, and the ranks of its group in a receive's from any source.
//! * **desync**: one (group, seq) issued as different ops (op, shapes, dtypes or reduce op) on
//!   different ranks. Only the first per group is reported: once a rank skipped an op, every
//!   later number differs too, and the first one is the cause.
//! * **gone**: a rank without a summary, or whose heartbeat is older than the timeout.
//!
//! The wording of each finding is in [`super::text`].
//!
//! Point-to-point ops are numbered apart from collectives (see [`is_p2p`]) and left out of
//! both comparisons: only the two ranks involved issue them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::entry::{is_p2p, Entry};
use super::summary::{RankSummary, Signature};

/// The default group's name, which every rank is a member of.
pub const WORLD: &str = "WORLD";

/// The diagnosis of a job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The number of ranks the job has.
    pub world_size: usize,
    /// Per group, the op ranks wait in and the ranks that have not issued it.
    pub behind: Vec<Behind>,
    /// Per group, the first sequence number issued as different ops.
    pub desyncs: Vec<Desync>,
    /// Ranks without a summary or heartbeat, ascending.
    pub gone: Vec<Gone>,
}

/// An op some ranks wait in while others of its group have not issued it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Behind {
    /// The group.
    pub group: String,
    /// The op's sequence number on the group.
    pub seq: u64,
    /// The op (as the lowest waiting rank issued it).
    pub op: String,
    /// Where the lowest waiting rank issued it.
    pub call_site: String,
    /// How long the longest-waiting rank has waited (ms).
    pub waiting_for_ms: Option<u64>,
    /// The ranks waiting in it, ascending.
    pub waiting: Vec<usize>,
    /// The ranks of the group that have not issued it, ascending.
    pub ranks: Vec<BehindRank>,
}

/// A rank that has not issued the op others wait in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BehindRank {
    /// The rank.
    pub rank: usize,
    /// The last sequence number it issued on the group (0: none).
    pub last_seq: u64,
    /// The op it completed last (any group).
    pub last_completed: Option<Entry>,
    /// How long ago that was (ms).
    pub last_completed_age_ms: Option<u64>,
    /// The oldest op it waits in itself (another group, or a point-to-point op).
    pub waits_in: Option<Entry>,
    /// How long it has waited in that (ms).
    pub waits_in_for_ms: Option<u64>,
}

/// One (group, seq) issued as different ops on different ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desync {
    /// The group.
    pub group: String,
    /// The sequence number.
    pub seq: u64,
    /// Each distinct (op, call site) and the ranks that issued it, by lowest rank.
    pub variants: Vec<DesyncVariant>,
}

/// The ranks that issued one variant of a desynchronised op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesyncVariant {
    /// The ranks, ascending.
    pub ranks: Vec<usize>,
    /// What they issued.
    pub signature: Signature,
}

/// A rank the job cannot hear from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gone {
    /// The rank.
    pub rank: usize,
    /// How old its last heartbeat is (ms); `None`: it published no summary at all.
    pub heartbeat_age_ms: Option<u64>,
    /// Its host, when known.
    pub host: Option<String>,
    /// Its process id, when known.
    pub pid: Option<u32>,
}

impl Report {
    /// True when nothing was found.
    pub fn is_empty(&self) -> bool {
        self.behind.is_empty() && self.desyncs.is_empty() && self.gone.is_empty()
    }

    /// The JSON form, for tools.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serializes")
    }
}

/// Diagnoses a job of `world_size` ranks from their summaries at `now_ms`; a rank whose
/// heartbeat is older than `heartbeat_timeout_ms` is gone. Summaries of ranks outside the
/// world are ignored; of two for one rank, the later one counts.
pub fn diagnose(
    summaries: &[RankSummary],
    world_size: usize,
    now_ms: u64,
    heartbeat_timeout_ms: u64,
) -> Report {
    let mut by_rank: BTreeMap<usize, &RankSummary> = BTreeMap::new();
    for s in summaries.iter().filter(|s| s.rank < world_size) {
        let keep = by_rank
            .get(&s.rank)
            .is_none_or(|old| old.heartbeat_ms <= s.heartbeat_ms);
        if keep {
            by_rank.insert(s.rank, s);
        }
    }
    let known: Vec<Known> = by_rank.values().map(|s| Known::of(s)).collect();
    Report {
        world_size,
        behind: find_behind(&known, now_ms),
        desyncs: find_desyncs(&known),
        gone: find_gone(&by_rank, world_size, now_ms, heartbeat_timeout_ms),
    }
}

/// One rank's summary, indexed: its collectives' signatures by (group, seq), and the last
/// sequence number it issued on each group.
struct Known<'a> {
    summary: &'a RankSummary,
    ops: BTreeMap<(String, u64), Signature>,
    last_seq: BTreeMap<String, u64>,
}

impl<'a> Known<'a> {
    fn of(summary: &'a RankSummary) -> Self {
        let mut ops = BTreeMap::new();
        let mut last_seq = summary.last_seq.clone();
        let entries = summary.pending.iter().chain(summary.last_completed.iter());
        let sigs = summary.recent.iter().cloned();
        for sig in sigs.chain(entries.map(Signature::of)) {
            if is_p2p(&sig.op) {
                continue;
            }
            let last = last_seq.entry(sig.group.clone()).or_insert(0);
            *last = (*last).max(sig.seq);
            ops.entry((sig.group.clone(), sig.seq)).or_insert(sig);
        }
        Known {
            summary,
            ops,
            last_seq,
        }
    }

    fn issued(&self, group: &str) -> Option<u64> {
        self.last_seq.get(group).copied()
    }
}

fn find_behind(known: &[Known], now_ms: u64) -> Vec<Behind> {
    // The oldest pending collective of each group, over all ranks.
    let mut oldest: BTreeMap<&str, u64> = BTreeMap::new();
    for k in known {
        for e in k.summary.pending.iter().filter(|e| !is_p2p(&e.op)) {
            let seq = oldest.entry(e.group.as_str()).or_insert(e.seq);
            *seq = (*seq).min(e.seq);
        }
    }
    let mut out = Vec::new();
    for (group, seq) in oldest {
        let mut waiting = Vec::new();
        let mut waiting_for_ms: Option<u64> = None;
        let mut lowest: Option<&Entry> = None;
        for k in known {
            let entry = k.summary.pending.iter().find(|e| {
                e.group == group && e.seq == seq && !is_p2p(&e.op) && e.state.is_pending()
            });
            if let Some(e) = entry {
                waiting.push(k.summary.rank);
                lowest = lowest.or(Some(e));
                if let Some(t) = e.issued_at_ms {
                    let ms = now_ms.saturating_sub(t);
                    waiting_for_ms = Some(waiting_for_ms.map_or(ms, |w| w.max(ms)));
                }
            }
        }
        let ranks: Vec<BehindRank> = known
            .iter()
            .filter(|k| match k.issued(group) {
                Some(last) => last < seq,
                None => member_by_name(k, group),
            })
            .map(|k| behind_rank(k, group, now_ms))
            .collect();
        if ranks.is_empty() {
            continue;
        }
        let (op, call_site) = lowest.map_or((String::new(), String::new()), |e| {
            (e.op.clone(), e.call_site.clone())
        });
        out.push(Behind {
            group: group.to_string(),
            seq,
            op,
            call_site,
            waiting_for_ms,
            waiting,
            ranks,
        });
    }
    out
}

/// Whether a rank that has issued nothing on `group` is still one of its members: every rank
/// is in `WORLD`; a point-to-point channel (`BASE:p2p:S->D`) has its two ranks, so that a
/// receive whose sender never sent names the sender; any member of `BASE` may send to a
/// receive from any source (`BASE:p2p:any->D`).
fn member_by_name(k: &Known, group: &str) -> bool {
    if group == WORLD {
        return true;
    }
    let Some((base, pair)) = group.rsplit_once(":p2p:") else {
        return false;
    };
    let Some((src, dst)) = pair.split_once("->") else {
        return false;
    };
    let rank = k.summary.rank.to_string();
    if src == "any" {
        return dst != rank && (base == WORLD || k.issued(base).is_some());
    }
    src == rank || dst == rank
}

fn behind_rank(k: &Known, group: &str, now_ms: u64) -> BehindRank {
    let s = k.summary;
    let waits_in = s.pending.first().cloned();
    BehindRank {
        rank: s.rank,
        last_seq: k.issued(group).unwrap_or(0),
        last_completed_age_ms: s
            .last_completed
            .as_ref()
            .and_then(|e| e.completed_at_ms)
            .map(|t| now_ms.saturating_sub(t)),
        last_completed: s.last_completed.clone(),
        waits_in_for_ms: waits_in
            .as_ref()
            .and_then(|e| e.issued_at_ms)
            .map(|t| now_ms.saturating_sub(t)),
        waits_in,
    }
}

fn find_desyncs(known: &[Known]) -> Vec<Desync> {
    let mut by_op: BTreeMap<(&str, u64), Vec<(usize, &Signature)>> = BTreeMap::new();
    for k in known {
        for ((group, seq), sig) in &k.ops {
            by_op
                .entry((group.as_str(), *seq))
                .or_default()
                .push((k.summary.rank, sig));
        }
    }
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    // BTreeMap order: by group, then ascending seq, so the first desync of a group comes first.
    for ((group, seq), issued) in by_op {
        if reported.contains(group) {
            continue;
        }
        let first = issued[0].1;
        if issued.iter().all(|(_, sig)| sig.same_op(first)) {
            continue;
        }
        let mut variants: Vec<DesyncVariant> = Vec::new();
        for (rank, sig) in issued {
            match variants
                .iter_mut()
                .find(|v| v.signature.same_op(sig) && v.signature.call_site == sig.call_site)
            {
                Some(v) => v.ranks.push(rank),
                None => variants.push(DesyncVariant {
                    ranks: vec![rank],
                    signature: sig.clone(),
                }),
            }
        }
        reported.insert(group);
        out.push(Desync {
            group: group.to_string(),
            seq,
            variants,
        });
    }
    out
}

fn find_gone(
    by_rank: &BTreeMap<usize, &RankSummary>,
    world_size: usize,
    now_ms: u64,
    timeout_ms: u64,
) -> Vec<Gone> {
    (0..world_size)
        .filter_map(|rank| match by_rank.get(&rank) {
            None => Some(Gone {
                rank,
                heartbeat_age_ms: None,
                host: None,
                pid: None,
            }),
            Some(s) => {
                let age = now_ms.saturating_sub(s.heartbeat_ms);
                (age > timeout_ms).then(|| Gone {
                    rank,
                    heartbeat_age_ms: Some(age),
                    host: Some(s.host.clone()),
                    pid: Some(s.pid),
                })
            }
        })
        .collect()
}
