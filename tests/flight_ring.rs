//! The flight recorder's ring: capacity, order, overwrite, per-group sequence numbers, state
//! changes, thread safety and the per-rank summary, against a model (proptest) and directly.

use std::collections::HashMap;
use std::sync::Arc;

use ferrodist::flight::{now_ms, Dump, OpDescription, OpState, RankSummary, Recorder, TensorMeta};
use proptest::prelude::*;

fn rec(r: &Recorder, group: &str, op: &str) -> (u64, u64) {
    r.record(
        group,
        op.to_string(),
        vec![vec![4]],
        vec!["float32".into()],
        Some("SUM".into()),
        "t.py:1".into(),
    )
}

#[test]
fn keeps_the_last_capacity_ops_oldest_first() {
    let r = Recorder::new(4);
    for i in 1..=10 {
        assert_eq!(rec(&r, "WORLD", "all_reduce"), (i, i));
    }
    let ids: Vec<u64> = r.entries().iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![7, 8, 9, 10]);
    let seqs: Vec<u64> = r.entries().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![7, 8, 9, 10]);
}

#[test]
fn numbers_each_group_and_point_to_point_apart() {
    let r = Recorder::new(16);
    assert_eq!(rec(&r, "WORLD", "all_reduce").1, 1);
    assert_eq!(rec(&r, "pg1", "broadcast").1, 1);
    assert_eq!(rec(&r, "WORLD", "send").1, 1);
    assert_eq!(rec(&r, "WORLD", "ddp.all_reduce").1, 2);
    assert_eq!(rec(&r, "WORLD", "irecv").1, 2);
    assert_eq!(rec(&r, "pg1", "all_gather").1, 2);
    let s = r.summary(0, now_ms());
    assert_eq!(s.last_seq.get("WORLD"), Some(&2));
    assert_eq!(s.last_seq.get("pg1"), Some(&2));
}

#[test]
fn a_moved_op_takes_its_new_groups_next_number_even_once_dropped() {
    let r = Recorder::new(2);
    assert_eq!(rec(&r, "WORLD:p2p:0->1", "p2p 0->1"), (1, 1));
    let (any, seq) = rec(&r, "WORLD:p2p:any->1", "p2p any->1");
    assert_eq!((any, seq), (2, 1));
    assert_eq!(r.moved(any, "WORLD:p2p:0->1", "p2p 0->1"), 2);
    let e = r.entries();
    let moved = e.iter().find(|e| e.id == any).unwrap();
    assert_eq!((moved.group.as_str(), moved.seq), ("WORLD:p2p:0->1", 2));
    assert_eq!(moved.op, "p2p 0->1");
    // Dropped from the ring before its source was known: the channel still counts it.
    let (gone, _) = rec(&r, "WORLD:p2p:any->1", "p2p any->1");
    rec(&r, "WORLD", "all_reduce");
    rec(&r, "WORLD", "all_reduce");
    assert!(r.entries().iter().all(|e| e.id != gone));
    assert_eq!(r.moved(gone, "WORLD:p2p:2->1", "p2p 2->1"), 1);
    assert_eq!(rec(&r, "WORLD:p2p:2->1", "p2p 2->1").1, 2);
    let s = r.summary(1, now_ms());
    assert_eq!(s.last_seq.get("WORLD:p2p:0->1"), Some(&2));
}

#[test]
fn states_move_forward_only_and_unknown_ids_are_ignored() {
    let r = Recorder::new(2);
    let (a, _) = rec(&r, "WORLD", "all_reduce");
    let (b, _) = rec(&r, "WORLD", "all_reduce");
    r.started(a);
    r.completed(a);
    r.started(a); // late: ignored
    r.failed(b, "peer reset");
    r.completed(b); // after failing: ignored
    r.completed(999); // never issued
    let e = r.entries();
    assert_eq!(e[0].state, OpState::Completed);
    assert!(e[0].started_at_ms.is_some() && e[0].completed_at_ms.is_some());
    assert_eq!(e[1].state, OpState::Failed);
    assert_eq!(e[1].error.as_deref(), Some("peer reset"));
    let (c, _) = rec(&r, "WORLD", "all_reduce");
    let (_, _) = rec(&r, "WORLD", "all_reduce");
    r.completed(a); // overwritten: ignored, no panic
    r.completed(c);
    assert_eq!(r.entries()[0].state, OpState::Completed);
}

#[test]
fn capacity_zero_keeps_nothing_but_still_numbers() {
    let r = Recorder::new(0);
    assert_eq!(rec(&r, "WORLD", "all_reduce"), (1, 1));
    assert_eq!(rec(&r, "WORLD", "all_reduce"), (2, 2));
    r.completed(1);
    assert!(r.entries().is_empty());
    assert_eq!(r.summary(0, 0).last_seq.get("WORLD"), Some(&2));
}

#[test]
fn concurrent_records_get_unique_ids_and_dense_seqs() {
    let r = Arc::new(Recorder::new(100_000));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    let (id, _) = rec(&r, "WORLD", "all_reduce");
                    r.completed(id);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let entries = r.entries();
    assert_eq!(entries.len(), 4000);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.id, i as u64 + 1);
        assert_eq!(e.seq, i as u64 + 1);
        assert_eq!(e.state, OpState::Completed);
    }
}

#[test]
fn summary_has_pending_oldest_first_the_last_completed_and_recent() {
    let r = Recorder::new(100);
    let (done, _) = rec(&r, "WORLD", "all_reduce");
    r.completed(done);
    let pending: Vec<u64> = (0..10).map(|_| rec(&r, "pg1", "broadcast").0).collect();
    for _ in 0..70 {
        let (id, _) = rec(&r, "WORLD", "all_gather");
        r.completed(id);
    }
    let last = rec(&r, "WORLD", "barrier").0;
    r.completed(last);
    let s = r.summary(3, 1234);
    assert_eq!((s.rank, s.heartbeat_ms, s.version), (3, 1234, 1));
    assert_eq!(s.pid, std::process::id());
    assert_eq!(s.last_completed.as_ref().map(|e| e.id), Some(last));
    let ids: Vec<u64> = s.pending.iter().map(|e| e.id).collect();
    assert_eq!(ids, pending[..8].to_vec());
    assert_eq!(s.recent.len(), 64);
    assert_eq!(s.recent.last().map(|g| g.op.as_str()), Some("barrier"));
    assert_eq!(RankSummary::from_json(&s.to_json()).unwrap(), s);
}

#[test]
fn summary_keeps_the_last_completed_op_after_the_ring_drops_it() {
    let r = Recorder::new(2);
    let (done, _) = rec(&r, "WORLD", "all_reduce");
    r.completed(done);
    rec(&r, "WORLD", "all_reduce");
    rec(&r, "WORLD", "all_reduce");
    let s = r.summary(0, 0);
    assert_eq!(s.last_completed.map(|e| e.id), Some(done));
    assert_eq!(s.pending.len(), 2);
}

#[test]
fn summary_json_of_another_version_is_refused() {
    let s = Recorder::new(2).summary(0, 0);
    let text = s.to_json().replace("\"version\":1", "\"version\":2");
    let err = RankSummary::from_json(&text).unwrap_err();
    assert!(matches!(err, ferrodist::Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("version 2"), "{err}");
}

#[test]
fn ops_described_by_shared_parts_read_back_as_their_own() {
    let r = Recorder::new(4);
    let world: Arc<str> = "WORLD".into();
    let shapes = Arc::new(TensorMeta {
        shapes: vec![vec![32, 32]],
        dtypes: vec!["float32".into()],
    });
    let shared = |op: &str, site: &str| OpDescription {
        group: Arc::clone(&world),
        op: op.into(),
        tensors: Arc::clone(&shapes),
        reduce_op: None,
        call_site: site.into(),
    };
    let (a, _) = r.record_op(shared("all_gather", "a.py:2"));
    let (b, seq) = r.record_op(shared("all_gather", "a.py:2"));
    assert_eq!(seq, 2);
    // Moving one op takes it off the parts it shared; the op beside it keeps them.
    assert_eq!(r.moved(a, "WORLD:p2p:0->1", "p2p 0->1"), 1);
    r.completed(b);
    let owned = r.record(
        "WORLD",
        "all_gather".into(),
        vec![vec![32, 32]],
        vec!["float32".into()],
        None,
        "a.py:2".into(),
    );
    assert_eq!(owned, (3, 3));
    let e = r.entries();
    assert_eq!(
        (e[0].group.as_str(), e[0].op.as_str()),
        ("WORLD:p2p:0->1", "p2p 0->1")
    );
    assert_eq!(
        (e[1].group.as_str(), e[1].op.as_str()),
        ("WORLD", "all_gather")
    );
    assert_eq!((&e[1].shapes, &e[1].dtypes), (&e[2].shapes, &e[2].dtypes));
    assert_eq!(e[1].call_site, e[2].call_site);
    // Dropping the shared ops out of the ring leaves the parts to the ops still holding them.
    for _ in 0..4 {
        r.record_op(shared("all_gather", "a.py:3"));
    }
    assert!(r.entries().iter().all(|e| e.shapes == vec![vec![32, 32]]));
}

#[test]
fn the_rings_summary_is_the_one_its_dump_gives() {
    let r = Recorder::new(100);
    for i in 0..150u64 {
        let (id, _) = rec(&r, if i % 3 == 0 { "pg1" } else { "WORLD" }, "all_reduce");
        if i % 11 != 0 {
            r.completed(id);
        }
    }
    let live = r.summary(2, 99);
    let dumped = RankSummary::from_dump(&Dump::of(&r, 2, 4, "manual", 99));
    assert_eq!(live.pending, dumped.pending);
    assert_eq!(live.recent, dumped.recent);
    assert_eq!(live.pending.len(), 8);
    assert_eq!(live.recent.len(), 64);
}

#[derive(Clone, Debug)]
enum Step {
    Record(u8, bool),
    Complete(u64),
    Fail(u64),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (0u8..3, any::<bool>()).prop_map(|(g, p)| Step::Record(g, p)),
            (1u64..200).prop_map(Step::Complete),
            (1u64..200).prop_map(Step::Fail),
        ],
        0..200,
    )
}

proptest! {
    #[test]
    fn ring_matches_a_model(capacity in 0usize..20, steps in steps()) {
        let r = Recorder::new(capacity);
        // Model: every op ever issued, in order: (group, p2p, seq, state).
        let mut model: Vec<(String, bool, u64, OpState)> = Vec::new();
        let mut seqs: HashMap<(String, bool), u64> = HashMap::new();
        for step in steps {
            match step {
                Step::Record(g, p2p) => {
                    let group = format!("g{g}");
                    let op = if p2p { "send" } else { "all_reduce" };
                    let seq = seqs.entry((group.clone(), p2p)).or_insert(0);
                    *seq += 1;
                    let (id, got) = rec(&r, &group, op);
                    prop_assert_eq!(id, model.len() as u64 + 1);
                    prop_assert_eq!(got, *seq);
                    model.push((group, p2p, *seq, OpState::Issued));
                }
                Step::Complete(id) | Step::Fail(id) => {
                    let failed = matches!(step, Step::Fail(_));
                    if failed { r.failed(id, "x") } else { r.completed(id) }
                    let kept = model.len().saturating_sub(capacity) as u64;
                    if id > kept && id <= model.len() as u64 {
                        let state = &mut model[id as usize - 1].3;
                        if state.is_pending() {
                            *state = if failed { OpState::Failed } else { OpState::Completed };
                        }
                    }
                }
            }
        }
        let entries = r.entries();
        let kept = &model[model.len().saturating_sub(capacity)..];
        prop_assert_eq!(entries.len(), kept.len());
        let first_id = (model.len() - kept.len()) as u64 + 1;
        for (i, (e, m)) in entries.iter().zip(kept).enumerate() {
            prop_assert_eq!(e.id, first_id + i as u64);
            prop_assert_eq!(&e.group, &m.0);
            prop_assert_eq!(e.seq, m.2);
            prop_assert_eq!(e.state, m.3);
        }
        let s = r.summary(0, 0);
        let pending: Vec<u64> = entries.iter().filter(|e| e.state.is_pending())
            .take(8).map(|e| e.id).collect();
        prop_assert_eq!(s.pending.iter().map(|e| e.id).collect::<Vec<_>>(), pending);
        prop_assert_eq!(s.recent.len(), entries.len().min(64));
    }
}
