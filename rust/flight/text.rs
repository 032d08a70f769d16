//! The report as a person reads it: one line per finding, rank lists compacted
//! (`ranks 0-2 and 4-7`), ages in seconds, ops named with their call sites.
//!
//! Apart from [`mod@super::diagnose`]'s logic so that the wording can change without touching
//! what is found; the JSON form (serde, in `diagnose`) is what tools rely on.

use std::fmt;

use super::diagnose::{Behind, BehindRank, Desync, Gone, Report};
use super::entry::Entry;
use super::summary::Signature;

/// Behind ranks described one by one; more are only listed.
const DESCRIBED: usize = 8;

/// `rank 3`, `ranks 0-2 and 4-7`, `ranks 1, 3 and 5`.
pub fn fmt_ranks(ranks: &[usize]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        runs.push(if j == i {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    let noun = if sorted.len() == 1 { "rank" } else { "ranks" };
    match runs.split_last() {
        None => "no ranks".to_string(),
        Some((last, [])) => format!("{noun} {last}"),
        Some((last, rest)) => format!("{noun} {} and {last}", rest.join(", ")),
    }
}

/// `0.4 s`, `43 s`.
pub(crate) fn fmt_age(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} s", ms / 1000)
    }
}

/// `all_reduce [[4]] float32 SUM at a.py:10`.
fn fmt_signature(s: &Signature) -> String {
    let mut text = format!("{} {:?} {}", s.op, s.shapes, s.dtypes.join(","));
    if let Some(r) = &s.reduce_op {
        text.push(' ');
        text.push_str(r);
    }
    text.push_str(" at ");
    text.push_str(&s.call_site);
    text
}

/// `#811 (all_reduce at train.py:88)`, naming the group when it is not `group`.
fn fmt_op(e: &Entry, group: &str) -> String {
    let on = if e.group == group {
        String::new()
    } else {
        format!(" on {}", e.group)
    };
    format!("#{}{on} ({} at {})", e.seq, e.op, e.call_site)
}

fn fmt_behind_rank(r: &BehindRank, group: &str) -> String {
    let mut text = fmt_ranks(&[r.rank]);
    match (&r.last_completed, r.last_completed_age_ms) {
        (Some(e), age) => {
            text.push_str(" last completed ");
            text.push_str(&fmt_op(e, group));
            if let Some(age) = age {
                text.push_str(&format!(" {} ago", fmt_age(age)));
            }
            text.push_str(" and");
        }
        (None, _) => text.push_str(" has completed nothing and"),
    }
    match &r.waits_in {
        None if r.last_completed.is_some() => text.push_str(" has issued nothing since"),
        None => text.push_str(" has issued nothing"),
        Some(e) => {
            let on = if e.group == group {
                String::new()
            } else {
                format!(" on {}", e.group)
            };
            text.push_str(&format!(
                " waits in {} #{}{on} at {}",
                e.op, e.seq, e.call_site
            ));
            if let Some(ms) = r.waits_in_for_ms {
                text.push_str(&format!(" for {}", fmt_age(ms)));
            }
        }
    }
    text
}

impl fmt::Display for Behind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{} on {}: ", self.op, self.seq, self.group)?;
        if self.waiting.is_empty() {
            write!(f, "no rank waits in it")?;
        } else {
            let verb = if self.waiting.len() == 1 {
                "waits"
            } else {
                "wait"
            };
            write!(f, "{} {verb} in it", fmt_ranks(&self.waiting))?;
            if let Some(ms) = self.waiting_for_ms {
                write!(f, " (for {}, at {})", fmt_age(ms), self.call_site)?;
            }
        }
        for r in self.ranks.iter().take(DESCRIBED) {
            write!(f, "; {}", fmt_behind_rank(r, &self.group))?;
        }
        if self.ranks.len() > DESCRIBED {
            let rest: Vec<usize> = self.ranks[DESCRIBED..].iter().map(|r| r.rank).collect();
            let verb = if rest.len() == 1 { "has" } else { "have" };
            write!(f, "; {} {verb} not issued it either", fmt_ranks(&rest))?;
        }
        Ok(())
    }
}

impl fmt::Display for Desync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "desync at #{} on {}: ", self.seq, self.group)?;
        let parts: Vec<String> = self
            .variants
            .iter()
            .map(|v| format!("{} {}", fmt_ranks(&v.ranks), fmt_signature(&v.signature)))
            .collect();
        write!(f, "{}", parts.join(", "))
    }
}

impl fmt::Display for Gone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is gone: ", fmt_ranks(&[self.rank]))?;
        match self.heartbeat_age_ms {
            None => write!(f, "it published no summary"),
            Some(age) => {
                write!(f, "no heartbeat for {}", fmt_age(age))?;
                if let (Some(host), Some(pid)) = (&self.host, self.pid) {
                    write!(f, " (host {host}, pid {pid})")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(
                f,
                "no hang found: all {} ranks report, none is behind or out of step",
                self.world_size
            );
        }
        let mut lines: Vec<String> = Vec::new();
        lines.extend(self.desyncs.iter().map(ToString::to_string));
        lines.extend(self.behind.iter().map(ToString::to_string));
        let silent: Vec<usize> = self
            .gone
            .iter()
            .filter(|g| g.heartbeat_age_ms.is_none())
            .map(|g| g.rank)
            .collect();
        if !silent.is_empty() {
            let verb = if silent.len() == 1 { "is" } else { "are" };
            lines.push(format!(
                "{} {verb} gone: no summary published",
                fmt_ranks(&silent)
            ));
        }
        lines.extend(
            self.gone
                .iter()
                .filter(|g| g.heartbeat_age_ms.is_some())
                .map(ToString::to_string),
        );
        write!(f, "{}", lines.join("\n"))
    }
}
