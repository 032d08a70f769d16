//! The hang diagnosis from real recorders' summaries: a rank behind, a desync (op and shape),
//! ranks gone, subgroups and point-to-point ops that must not be blamed, a clean job.

use ferrodist::flight::{diagnose, now_ms, RankSummary, Recorder, Report};

const MINUTE: u64 = 60_000;

fn op(r: &Recorder, group: &str, op: &str, shape: i64, reduce: Option<&str>, site: &str) -> u64 {
    r.record(
        group,
        op.to_string(),
        vec![vec![shape]],
        vec!["float32".into()],
        reduce.map(str::to_string),
        site.to_string(),
    )
    .0
}

fn done(r: &Recorder, group: &str, name: &str, site: &str) {
    let id = op(r, group, name, 4, Some("SUM"), site);
    r.completed(id);
}

fn summaries(ranks: &[Recorder]) -> Vec<RankSummary> {
    let now = now_ms();
    ranks
        .iter()
        .enumerate()
        .map(|(i, r)| r.summary(i, now))
        .collect()
}

fn job(n: usize) -> Vec<Recorder> {
    (0..n).map(|_| Recorder::new(2048)).collect()
}

#[test]
fn names_the_rank_that_never_issued_the_op_others_wait_in() {
    let ranks = job(8);
    for (i, r) in ranks.iter().enumerate() {
        for _ in 0..811 {
            done(r, "WORLD", "all_reduce", "train.py:88");
        }
        if i != 3 {
            op(r, "WORLD", "all_reduce", 4, Some("SUM"), "train.py:88");
        }
    }
    let report = diagnose(&summaries(&ranks), 8, now_ms() + 43_000, MINUTE);
    assert!(
        report.desyncs.is_empty() && report.gone.is_empty(),
        "{report}"
    );
    assert_eq!(report.behind.len(), 1);
    let b = &report.behind[0];
    assert_eq!((b.group.as_str(), b.seq), ("WORLD", 812));
    assert_eq!(b.waiting, vec![0, 1, 2, 4, 5, 6, 7]);
    assert_eq!(b.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![3]);
    let text = report.to_string();
    assert!(
        text.starts_with(
            "all_reduce #812 on WORLD: ranks 0-2 and 4-7 wait in it (for 43 s, at train.py:88); \
             rank 3 last completed #811 (all_reduce at train.py:88) 43 s ago and has issued \
             nothing since"
        ),
        "{text}"
    );
}

#[test]
fn a_rank_stuck_in_another_group_is_named_with_where_it_waits() {
    let ranks = job(2);
    done(&ranks[0], "WORLD", "all_reduce", "a.py:1");
    done(&ranks[1], "WORLD", "all_reduce", "a.py:1");
    op(&ranks[0], "WORLD", "all_reduce", 4, Some("SUM"), "a.py:2");
    op(&ranks[1], "pg1", "broadcast", 4, None, "b.py:7");
    let report = diagnose(&summaries(&ranks), 2, now_ms(), MINUTE);
    let text = report.to_string();
    assert!(text.contains("rank 0 waits in it"), "{text}");
    assert!(
        text.contains("rank 1 last completed #1 (all_reduce at a.py:1)"),
        "{text}"
    );
    assert!(
        text.contains("waits in broadcast #1 on pg1 at b.py:7"),
        "{text}"
    );
}

#[test]
fn names_a_desync_with_both_call_sites() {
    let ranks = job(2);
    for r in &ranks {
        for _ in 0..36 {
            done(r, "WORLD", "all_reduce", "a.py:5");
        }
    }
    op(&ranks[0], "WORLD", "all_reduce", 4, Some("SUM"), "a.py:10");
    op(&ranks[1], "WORLD", "broadcast", 4, None, "a.py:12");
    // Everything after the first divergence differs too; only the first is reported.
    op(&ranks[0], "WORLD", "all_gather", 4, None, "a.py:20");
    let report = diagnose(&summaries(&ranks), 2, now_ms(), MINUTE);
    assert_eq!(report.desyncs.len(), 1, "{report}");
    assert!(report.behind.is_empty(), "{report}");
    assert_eq!(
        report.to_string(),
        "desync at #37 on WORLD: rank 0 all_reduce [[4]] float32 SUM at a.py:10, \
         rank 1 broadcast [[4]] float32 at a.py:12"
    );
}

#[test]
fn a_shape_mismatch_is_a_desync_and_matching_ranks_are_grouped() {
    let ranks = job(4);
    for (i, r) in ranks.iter().enumerate() {
        let shape = if i == 2 { 8 } else { 4 };
        op(r, "WORLD", "all_reduce", shape, Some("SUM"), "m.py:3");
    }
    let report = diagnose(&summaries(&ranks), 4, now_ms(), MINUTE);
    assert_eq!(
        report.to_string(),
        "desync at #1 on WORLD: ranks 0-1 and 3 all_reduce [[4]] float32 SUM at m.py:3, \
         rank 2 all_reduce [[8]] float32 SUM at m.py:3"
    );
}

#[test]
fn ranks_without_summary_or_heartbeat_are_gone() {
    let ranks = job(4);
    for r in &ranks {
        done(r, "WORLD", "all_reduce", "a.py:1");
    }
    let now = now_ms();
    let mut s = summaries(&ranks);
    s[1].heartbeat_ms = now - 90_000;
    s.remove(3);
    let report = diagnose(&s, 4, now, 30_000);
    let gone: Vec<(usize, bool)> = report
        .gone
        .iter()
        .map(|g| (g.rank, g.heartbeat_age_ms.is_some()))
        .collect();
    assert_eq!(gone, vec![(1, true), (3, false)]);
    let text = report.to_string();
    assert!(
        text.contains("rank 3 is gone: no summary published"),
        "{text}"
    );
    assert!(
        text.contains("rank 1 is gone: no heartbeat for 90 s (host "),
        "{text}"
    );
}

#[test]
fn subgroups_and_point_to_point_ops_blame_nobody_outside_them() {
    let ranks = job(3);
    for r in &ranks {
        done(r, "WORLD", "all_reduce", "a.py:1");
    }
    // Ranks 0 and 1 alone: a subgroup op in flight and a send/recv pair.
    for r in &ranks[..2] {
        done(r, "pg1", "all_reduce", "s.py:1");
        op(r, "pg1", "all_reduce", 4, Some("SUM"), "s.py:2");
    }
    let id = op(&ranks[0], "WORLD", "send", 4, None, "p.py:1");
    ranks[0].completed(id);
    op(&ranks[1], "WORLD", "recv", 4, None, "p.py:2");
    // The next collective on WORLD lines up on all three ranks despite the p2p ops.
    for r in &ranks {
        done(r, "WORLD", "all_reduce", "a.py:3");
    }
    let report = diagnose(&summaries(&ranks), 3, now_ms(), MINUTE);
    assert!(report.is_empty(), "{report}");
}

#[test]
fn two_ranks_that_each_wait_to_receive_first_name_each_other() {
    let ranks = job(3);
    for r in &ranks {
        done(r, "WORLD", "all_reduce", "a.py:1");
    }
    // A pipeline's classic deadlock, on channels neither rank has used yet.
    op(&ranks[0], "WORLD:p2p:1->0", "p2p 1->0", 4, None, "pp.py:10");
    op(&ranks[1], "WORLD:p2p:0->1", "p2p 0->1", 4, None, "pp.py:20");
    let report = diagnose(&summaries(&ranks), 3, now_ms() + 5_000, MINUTE);
    let text = report.to_string();
    assert_eq!(report.behind.len(), 2, "{text}");
    let blamed: Vec<(&str, Vec<usize>, Vec<usize>)> = report
        .behind
        .iter()
        .map(|b| {
            let ranks = b.ranks.iter().map(|r| r.rank).collect();
            (b.group.as_str(), b.waiting.clone(), ranks)
        })
        .collect();
    assert_eq!(
        blamed,
        vec![
            ("WORLD:p2p:0->1", vec![1], vec![0]),
            ("WORLD:p2p:1->0", vec![0], vec![1]),
        ]
    );
    assert!(
        text.contains(
            "p2p 1->0 #1 on WORLD:p2p:1->0: rank 0 waits in it (for 5.0 s, at pp.py:10); rank 1 \
             last completed #1 on WORLD (all_reduce at a.py:1)"
        ) && text.contains("waits in p2p 0->1 #1 on WORLD:p2p:0->1 at pp.py:20"),
        "{text}"
    );
    // Rank 2, in neither channel, is blamed for nothing.
    assert!(!text.contains("rank 2"), "{text}");
}

#[test]
fn a_receive_from_any_source_names_what_every_possible_sender_does() {
    let ranks = job(3);
    for r in &ranks {
        done(r, "WORLD", "all_reduce", "a.py:1");
    }
    op(
        &ranks[1],
        "WORLD:p2p:any->1",
        "p2p any->1",
        4,
        None,
        "w.py:7",
    );
    op(&ranks[0], "WORLD", "barrier", 4, None, "a.py:2");
    op(&ranks[2], "WORLD", "barrier", 4, None, "a.py:2");
    let report = diagnose(&summaries(&ranks), 3, now_ms() + 5_000, MINUTE);
    let text = report.to_string();
    let any = report
        .behind
        .iter()
        .find(|b| b.group == "WORLD:p2p:any->1")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(any.waiting, vec![1]);
    assert_eq!(any.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 2]);
    assert!(
        text.contains("waits in barrier #2 on WORLD at a.py:2"),
        "{text}"
    );
    // and on WORLD, rank 1 is the one the barrier waits for, in its receive
    assert!(
        text.contains("rank 1 last completed #1 (all_reduce at a.py:1)")
            && text.contains("waits in p2p any->1 #1 on WORLD:p2p:any->1 at w.py:7"),
        "{text}"
    );
}

#[test]
fn a_clean_job_reports_nothing_and_round_trips_as_json() {
    let ranks = job(4);
    for r in &ranks {
        for _ in 0..100 {
            done(r, "WORLD", "ddp.all_reduce", "train.py:9");
        }
    }
    let report = diagnose(&summaries(&ranks), 4, now_ms(), MINUTE);
    assert!(report.is_empty());
    assert_eq!(
        report.to_string(),
        "no hang found: all 4 ranks report, none is behind or out of step"
    );
    let json = report.to_json();
    assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), report);
}

#[test]
fn summaries_travel_as_json() {
    let ranks = job(2);
    op(&ranks[0], "WORLD", "all_reduce", 4, Some("SUM"), "a.py:1");
    let texts: Vec<String> = summaries(&ranks).iter().map(|s| s.to_json()).collect();
    let back: Vec<RankSummary> = texts
        .iter()
        .map(|t| RankSummary::from_json(t).unwrap())
        .collect();
    let report = diagnose(&back, 2, now_ms(), MINUTE);
    assert_eq!(report.behind.len(), 1);
    assert_eq!(report.behind[0].ranks[0].rank, 1);
    let json = report.to_json();
    assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), report);
}
