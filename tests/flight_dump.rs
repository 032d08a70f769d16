//! The dump file: a round trip through a real file, refusal of other formats and versions, and
//! a directory of dumps diagnosed like live summaries.

use ferrodist::flight::{diagnose, now_ms, Dump, RankSummary, Recorder};
use ferrodist::Error;

fn recorder(ops: usize, pending: bool) -> Recorder {
    let r = Recorder::new(64);
    for _ in 0..ops {
        let (id, _) = r.record(
            "WORLD",
            "all_reduce".into(),
            vec![vec![2, 3]],
            vec!["bfloat16".into()],
            Some("AVG".into()),
            "train.py:88".into(),
        );
        r.completed(id);
    }
    if pending {
        r.record(
            "WORLD",
            "all_reduce".into(),
            vec![vec![2, 3]],
            vec!["bfloat16".into()],
            Some("AVG".into()),
            "train.py:88".into(),
        );
    }
    r
}

#[test]
fn a_dump_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank0.json");
    let dump = Dump::of(&recorder(3, true), 0, 2, "SIGUSR1", now_ms());
    dump.write(&path).unwrap();
    let back = Dump::read(&path).unwrap();
    assert_eq!(back, dump);
    assert_eq!(back.entries.len(), 4);
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(value["format"], "ferrodist-flight-recorder");
    assert_eq!(value["version"], 1);
    assert_eq!(value["reason"], "SIGUSR1");
    assert_eq!(value["entries"][3]["state"], "issued");
}

#[test]
fn other_formats_and_versions_are_refused() {
    let text = Dump::of(&recorder(1, false), 0, 1, "manual", 0).to_json();
    let newer = text.replace("\"version\": 1", "\"version\": 2");
    let err = Dump::from_json(&newer).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(
        err.to_string().contains("version 2 is not supported"),
        "{err}"
    );
    let other = text.replace("ferrodist-flight-recorder", "fr_trace");
    let err = Dump::from_json(&other).unwrap_err();
    assert!(err.to_string().contains("format is \"fr_trace\""), "{err}");
    assert!(matches!(
        Dump::from_json("{\"rank\": 0}"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Dump::from_json("not json"),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn a_directory_of_dumps_is_diagnosed_like_live_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    for rank in 0..4 {
        let r = recorder(10, rank != 2);
        let path = dir.path().join(format!("rank{rank}.json"));
        Dump::of(&r, rank, 4, "timeout", now).write(&path).unwrap();
    }
    let mut summaries = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let dump = Dump::read(&entry.unwrap().path()).unwrap();
        summaries.push(RankSummary::from_dump(&dump));
    }
    let report = diagnose(&summaries, 4, now, u64::MAX);
    assert!(
        report.gone.is_empty() && report.desyncs.is_empty(),
        "{report}"
    );
    assert_eq!(report.behind.len(), 1, "{report}");
    let text = report.to_string();
    assert!(
        text.starts_with("all_reduce #11 on WORLD: ranks 0-1 and 3 wait in it"),
        "{text}"
    );
    assert!(
        text.contains("rank 2 last completed #10 (all_reduce at train.py:88)"),
        "{text}"
    );
}
