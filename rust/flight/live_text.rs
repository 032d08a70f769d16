//! The live view's two forms: the page a person reads (`GET /flight`, plain text) and the
//! Prometheus samples appended to `GET /metrics`.
//!
//! Every string shown comes from a store value that anyone with store access can write, so none
//! is trusted: on the page control characters become `?` (a crafted group name cannot forge a
//! line), in a label `\`, `"` and newlines are escaped as the exposition format says, and both
//! cut names at [`MAX_NAME_CHARS`]. The page is plain text, so there is no markup to inject.
//!
//! Label cardinality is bounded by the view's caps ([`super::live::MAX_JOBS`] jobs of at most
//! [`super::live::MAX_RANKS`] ranks, one group per rank: its last completed op's). The job's
//! label is `job_prefix`, not `job`, which Prometheus keeps for the scrape target's own name.

use std::fmt::Write as _;

use super::entry::Entry;
use super::live::{LiveView, MAX_JOBS, MAX_RANKS, STALE_AFTER_MS};
use super::summary::RankSummary;
use super::text::fmt_age;

/// Longest name (group, op, call site, host, prefix) shown, in characters.
pub const MAX_NAME_CHARS: usize = 160;

/// `s` cut to [`MAX_NAME_CHARS`], control characters as `?`.
fn shown(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_NAME_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().nth(MAX_NAME_CHARS).is_some() {
        out.push_str("...");
    }
    out
}

/// `s` cut to [`MAX_NAME_CHARS`] and escaped as a label value.
fn label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().take(MAX_NAME_CHARS) {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

fn job_name(prefix: &str) -> String {
    if prefix.is_empty() {
        "(no prefix)".to_string()
    } else {
        shown(prefix)
    }
}

fn age(now_ms: u64, then_ms: u64) -> u64 {
    now_ms.saturating_sub(then_ms)
}

/// `all_reduce #3 on WORLD at train.py:88`.
fn fmt_op(e: &Entry) -> String {
    format!(
        "{} #{} on {} at {}",
        shown(&e.op),
        e.seq,
        shown(&e.group),
        shown(&e.call_site)
    )
}

fn rank_lines(out: &mut String, s: &RankSummary, now_ms: u64) {
    let beat = age(now_ms, s.heartbeat_ms);
    let stale = if beat > STALE_AFTER_MS { "  STALE" } else { "" };
    let _ = writeln!(
        out,
        "  rank {}: heartbeat {} ago{stale}  (host {}, pid {})",
        s.rank,
        fmt_age(beat),
        shown(&s.host),
        s.pid
    );
    match &s.last_completed {
        None => out.push_str("    last completed: none yet\n"),
        Some(e) => {
            let when = e.completed_at_ms.map_or("at an unknown time".into(), |t| {
                format!("{} ago", fmt_age(age(now_ms, t)))
            });
            let _ = writeln!(out, "    last completed: {}, {when}", fmt_op(e));
        }
    }
    if let Some(oldest) = s.pending.first() {
        let since = oldest.issued_at_ms.map_or(String::new(), |t| {
            format!(", for {}", fmt_age(age(now_ms, t)))
        });
        let _ = writeln!(
            out,
            "    pending: {} op(s); oldest {} ({}{since})",
            s.pending.len(),
            fmt_op(oldest),
            oldest.state.as_str()
        );
    }
}

/// The page: jobs by prefix, one block per rank, stale heartbeats flagged, caps said.
pub fn render_page(view: &LiveView) -> String {
    let mut out = String::from("ferrodist flight recorder: live view\n");
    let _ = writeln!(
        out,
        "Each rank's watchdog publishes its summary at least every 5 s; STALE marks a heartbeat \
         older than {} s (the rank finished, was stopped, or died). Ages use this server's clock \
         against the ranks' clocks. At most {MAX_JOBS} jobs (by key prefix) and the lowest \
         {MAX_RANKS} ranks of each are shown.\n",
        STALE_AFTER_MS / 1000
    );
    if view.jobs.is_empty() {
        out.push_str("No flight recorder summaries in this store.\n");
    }
    for job in &view.jobs {
        let _ = writeln!(
            out,
            "job {}: {} rank(s)",
            job_name(&job.prefix),
            job.ranks_found
        );
        for s in &job.ranks {
            rank_lines(&mut out, s, view.now_ms);
        }
        for (rank, why) in &job.malformed {
            let _ = writeln!(out, "  rank {rank}: summary skipped: {}", shown(why));
        }
        if job.not_shown > 0 {
            let _ = writeln!(out, "  ... {} more rank(s) not shown", job.not_shown);
        }
        out.push('\n');
    }
    if view.jobs_not_shown > 0 {
        let _ = writeln!(
            out,
            "... {} more job(s) with {} rank(s) not shown",
            view.jobs_not_shown, view.ranks_of_jobs_not_shown
        );
    }
    let _ = writeln!(out, "malformed summaries skipped: {}", view.malformed());
    out
}

fn header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP ferrodist_flight_{name} {help}");
    let _ = writeln!(out, "# TYPE ferrodist_flight_{name} gauge");
}

/// Seconds from milliseconds, exactly.
fn secs(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The Prometheus samples (text format 0.0.4), one family per gauge; nothing for a store that
/// holds no summary (a store serving no ferrodist job shows only its own metrics).
pub fn render_prometheus(view: &LiveView) -> String {
    let mut out = String::new();
    if view.jobs.is_empty() {
        return out;
    }
    let each = |out: &mut String, f: &dyn Fn(&mut String, &str, &RankSummary)| {
        for job in &view.jobs {
            let prefix = label(&job.prefix);
            for s in &job.ranks {
                f(out, &prefix, s);
            }
        }
    };
    let now = view.now_ms;
    header(
        &mut out,
        "ranks",
        "Ranks with a flight recorder summary in this store, by job.",
    );
    for job in &view.jobs {
        let _ = writeln!(
            out,
            "ferrodist_flight_ranks{{job_prefix=\"{}\"}} {}",
            label(&job.prefix),
            job.ranks_found
        );
    }
    header(
        &mut out,
        "heartbeat_age_seconds",
        "Seconds since the rank's watchdog last published its summary.",
    );
    each(&mut out, &|out, p, s| {
        let v = secs(age(now, s.heartbeat_ms));
        let _ = writeln!(
            out,
            "ferrodist_flight_heartbeat_age_seconds{{job_prefix=\"{p}\",rank=\"{}\"}} {v}",
            s.rank
        );
    });
    header(
        &mut out,
        "last_completed_seq",
        "Sequence number of the rank's last completed op, on that op's group.",
    );
    each(&mut out, &|out, p, s| {
        if let Some(e) = &s.last_completed {
            let (r, g) = (s.rank, label(&e.group));
            let _ = writeln!(
                out,
                "ferrodist_flight_last_completed_seq{{job_prefix=\"{p}\",rank=\"{r}\",group=\"{g}\"}} {}",
                e.seq
            );
        }
    });
    header(
        &mut out,
        "last_completed_age_seconds",
        "Seconds since the rank's last completed op completed.",
    );
    each(&mut out, &|out, p, s| {
        let done = s.last_completed.as_ref().and_then(|e| e.completed_at_ms);
        if let Some(t) = done {
            let v = secs(age(now, t));
            let _ = writeln!(
                out,
                "ferrodist_flight_last_completed_age_seconds{{job_prefix=\"{p}\",rank=\"{}\"}} {v}",
                s.rank
            );
        }
    });
    header(
        &mut out,
        "pending_ops",
        "Ops the rank issued and has not finished (at most 8 are reported).",
    );
    each(&mut out, &|out, p, s| {
        let _ = writeln!(
            out,
            "ferrodist_flight_pending_ops{{job_prefix=\"{p}\",rank=\"{}\"}} {}",
            s.rank,
            s.pending.len()
        );
    });
    header(
        &mut out,
        "malformed_summaries",
        "Summaries in this store that could not be read, in the jobs shown.",
    );
    let _ = writeln!(
        out,
        "ferrodist_flight_malformed_summaries {}",
        view.malformed()
    );
    header(
        &mut out,
        "ranks_not_shown",
        "Ranks found beyond the caps (jobs, ranks per job, bytes read), left out.",
    );
    let _ = writeln!(
        out,
        "ferrodist_flight_ranks_not_shown {}",
        view.ranks_not_shown()
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::flight::entry::OpState;
    use crate::flight::live::JobView;
    use crate::flight::summary::SUMMARY_VERSION;

    fn entry(group: &str, seq: u64, state: OpState, at: u64) -> Entry {
        Entry {
            id: seq,
            group: group.into(),
            seq,
            op: "all_reduce".into(),
            shapes: vec![vec![4]],
            dtypes: vec!["float32".into()],
            reduce_op: Some("SUM".into()),
            call_site: "train.py:88".into(),
            state,
            issued_at_ms: Some(at),
            started_at_ms: None,
            completed_at_ms: (state == OpState::Completed).then_some(at),
            error: None,
        }
    }

    fn rank(rank: usize, beat: u64, done: Option<Entry>, pending: Vec<Entry>) -> RankSummary {
        RankSummary {
            version: SUMMARY_VERSION,
            rank,
            pid: 40 + rank as u32,
            host: "node-a".into(),
            heartbeat_ms: beat,
            last_completed: done,
            pending,
            recent: vec![],
            last_seq: BTreeMap::new(),
        }
    }

    fn view() -> LiveView {
        let now = 100_000;
        LiveView {
            now_ms: now,
            jobs: vec![JobView {
                prefix: "".into(),
                ranks_found: 3,
                ranks: vec![
                    rank(
                        0,
                        now - 400,
                        Some(entry("WORLD", 811, OpState::Completed, now - 43_000)),
                        vec![entry("WORLD", 812, OpState::Started, now - 42_000)],
                    ),
                    rank(1, now - 45_000, None, vec![]),
                ],
                malformed: vec![(2, "flight recorder summary: expected value".into())],
                not_shown: 0,
            }],
            jobs_not_shown: 1,
            ranks_of_jobs_not_shown: 8,
        }
    }

    #[test]
    fn the_page_names_last_ops_flags_stale_heartbeats_and_says_its_caps() {
        let page = render_page(&view());
        for line in [
            "job (no prefix): 3 rank(s)",
            "  rank 0: heartbeat 0.4 s ago  (host node-a, pid 40)",
            "    last completed: all_reduce #811 on WORLD at train.py:88, 43 s ago",
            "    pending: 1 op(s); oldest all_reduce #812 on WORLD at train.py:88 (started, for 42 s)",
            "  rank 1: heartbeat 45 s ago  STALE  (host node-a, pid 41)",
            "    last completed: none yet",
            "  rank 2: summary skipped: flight recorder summary: expected value",
            "... 1 more job(s) with 8 rank(s) not shown",
            "malformed summaries skipped: 1",
        ] {
            assert!(page.lines().any(|l| l == line), "{line:?} missing in\n{page}");
        }
        assert!(page.contains("At most 16 jobs"), "{page}");
    }

    #[test]
    fn the_samples_are_well_formed_and_labelled_by_job_rank_and_group() {
        let text = render_prometheus(&view());
        for line in [
            "ferrodist_flight_ranks{job_prefix=\"\"} 3",
            "ferrodist_flight_heartbeat_age_seconds{job_prefix=\"\",rank=\"0\"} 0.400",
            "ferrodist_flight_heartbeat_age_seconds{job_prefix=\"\",rank=\"1\"} 45.000",
            "ferrodist_flight_last_completed_seq{job_prefix=\"\",rank=\"0\",group=\"WORLD\"} 811",
            "ferrodist_flight_last_completed_age_seconds{job_prefix=\"\",rank=\"0\"} 43.000",
            "ferrodist_flight_pending_ops{job_prefix=\"\",rank=\"0\"} 1",
            "ferrodist_flight_pending_ops{job_prefix=\"\",rank=\"1\"} 0",
            "ferrodist_flight_malformed_summaries 1",
            "ferrodist_flight_ranks_not_shown 8",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in\n{text}"
            );
        }
        assert!(!text.contains("rank=\"1\",group"), "{text}");
        let none = LiveView {
            now_ms: 0,
            jobs: vec![],
            jobs_not_shown: 0,
            ranks_of_jobs_not_shown: 0,
        };
        assert_eq!(render_prometheus(&none), "");
    }

    #[test]
    fn hostile_names_cannot_forge_lines_or_labels() {
        let mut v = view();
        let evil = "W\"} 1\nferrodist_flight_pending_ops{rank=\"9\"} 999\n\\";
        v.jobs[0].prefix = evil.into();
        let mut done = entry(evil, 1, OpState::Completed, 1);
        done.call_site = format!("x.py:1\n  rank 7: heartbeat 0.0 s ago{}", "y".repeat(500));
        v.jobs[0].ranks[0].last_completed = Some(done);
        let text = render_prometheus(&v);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("ferrodist_flight_"), "{line}");
            let (_, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
        assert!(!text.lines().any(|l| l.ends_with(" 999")), "{text}");
        assert!(text
            .contains(r#"job_prefix="W\"} 1\nferrodist_flight_pending_ops{rank=\"9\"} 999\n\\""#));
        let page = render_page(&v);
        assert!(!page.lines().any(|l| l.starts_with("  rank 7")), "{page}");
        assert!(page.contains("x.py:1?  rank 7"), "{page}");
        assert!(
            page.lines().all(|l| l.chars().count() < 4 * MAX_NAME_CHARS),
            "{page}"
        );
    }
}
