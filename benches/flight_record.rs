//! The flight recorder's cost per op (criterion): one `record` plus one `completed` on a full
//! ring, which is what every collective pays with the recorder on (the default). The budget is
//! DDP/FSDP step time within 1 %, so this figure must stay far below a collective's latency
//! (tens of microseconds on gloo). The per-op path (`record_op`) describes an op by parts
//! shared with the job's other ops; `record` (owned strings and vectors) is the same ring with
//! each part allocated, and dropped when the ring overwrites its op.
//!
//! Run: `cargo bench --bench flight_record` (add `-- --quick` for a short run).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ferrodist::flight::{OpDescription, Recorder, TensorMeta};
use std::sync::Arc;

fn record_completed(c: &mut Criterion) {
    let recorder = Recorder::new(2048);
    // Fill the ring so every record also drops the oldest entry, as in a long job.
    for _ in 0..2048 {
        let (id, _) = recorder.record("WORLD", "warmup".into(), vec![], vec![], None, "x".into());
        recorder.completed(id);
    }
    c.bench_function("record + completed (all_reduce, 1 tensor)", |b| {
        b.iter(|| {
            let (id, seq) = recorder.record(
                black_box("WORLD"),
                "all_reduce".to_string(),
                vec![vec![1024, 1024]],
                vec!["float32".to_string()],
                Some("SUM".to_string()),
                "train.py:88".to_string(),
            );
            recorder.completed(black_box(id));
            seq
        })
    });
    let shared = OpDescription {
        group: "WORLD".into(),
        op: "all_reduce".into(),
        tensors: Arc::new(TensorMeta {
            shapes: vec![vec![1024, 1024]],
            dtypes: vec!["float32".into()],
        }),
        reduce_op: Some("SUM".into()),
        call_site: "train.py:88".into(),
    };
    c.bench_function("record_op + completed (all_reduce, shared parts)", |b| {
        b.iter(|| {
            let (id, seq) = recorder.record_op(black_box(&shared).clone());
            recorder.completed(black_box(id));
            seq
        })
    });
    c.bench_function("record + started + completed (ddp.all_reduce)", |b| {
        b.iter(|| {
            let (id, seq) = recorder.record(
                black_box("WORLD"),
                "ddp.all_reduce".to_string(),
                vec![vec![25 * 1024 * 1024 / 4]],
                vec!["float32".to_string()],
                Some("SUM".to_string()),
                "train.py:88".to_string(),
            );
            recorder.started(id);
            recorder.completed(black_box(id));
            seq
        })
    });
}

criterion_group!(benches, record_completed);
criterion_main!(benches);
