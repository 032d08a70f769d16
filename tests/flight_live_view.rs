//! `ferrodist-store --metrics-addr` shows the jobs' flight recorder summaries (issue 28 item 4):
//! the real binary, summaries set over the wire as a job's watchdog sets them (valid, stale,
//! malformed, hostile, two jobs), read back from `GET /flight` and `GET /metrics`; with the
//! etcd backend the page says the view is not available.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::etcd::{fresh_job, EtcdCluster};
use common::store_binary::store_client;
use ferrodist::flight::summary::SUMMARY_VERSION;
use ferrodist::flight::{now_ms, Entry, OpState, RankSummary};
use ferrodist::store::Store;
use ferrodist::tcp::TcpStore;

/// The binary with metrics on a port it picks; its store port and metrics address.
struct Served {
    child: Child,
    port: u16,
    metrics: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[String]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrodist-store"))
        .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "warn"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("a line").expect("text");
    let first = next();
    let port = first
        .strip_prefix("ferrodist-store listening on ")
        .and_then(|a| a.rsplit(':').next()?.parse().ok())
        .unwrap_or_else(|| panic!("got {first:?}"));
    let second = next();
    let metrics = second
        .strip_prefix("ferrodist-store metrics on http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("got {second:?}"))
        .to_owned();
    Served {
        child,
        port,
        metrics,
    }
}

/// `GET path`: status line and body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// `line` with each age (`0.4 s`, `43 s`) written `# s`.
fn without_ages(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let mut out = Vec::with_capacity(words.len());
    for (i, word) in words.iter().enumerate() {
        let is_age = words.get(i + 1).is_some_and(|next| next.starts_with('s'))
            && !word.is_empty()
            && word.chars().all(|c| c.is_ascii_digit() || c == '.');
        out.push(if is_age { "#" } else { word });
    }
    out.join(" ")
}

fn completed(group: &str, seq: u64, site: &str, at: u64) -> Entry {
    Entry {
        id: seq,
        group: group.into(),
        seq,
        op: "all_reduce".into(),
        shapes: vec![vec![1024]],
        dtypes: vec!["float32".into()],
        reduce_op: Some("SUM".into()),
        call_site: site.into(),
        state: OpState::Completed,
        issued_at_ms: Some(at),
        started_at_ms: Some(at),
        completed_at_ms: Some(at),
        error: None,
    }
}

fn summary(rank: usize, heartbeat_ms: u64, last: Option<Entry>, pending: Vec<Entry>) -> String {
    RankSummary {
        version: SUMMARY_VERSION,
        rank,
        pid: 1000 + rank as u32,
        host: "node-7".into(),
        heartbeat_ms,
        last_completed: last,
        pending,
        recent: vec![],
        last_seq: BTreeMap::new(),
    }
    .to_json()
}

/// Returns once the server has applied every `set` sent before: torch's SET has no reply, so
/// a set is only known to be stored once a request sent after it on the same connection has
/// been answered (the metrics page reads the store from another connection).
fn applied(store: &TcpStore) {
    store.num_keys().unwrap();
}

#[test]
fn the_page_and_the_metrics_show_each_ranks_last_op_and_heartbeat_by_job() {
    let served = serve(&[]);
    let store = store_client(served.port);
    let now = now_ms();
    let mut stuck = completed("WORLD", 812, "train.py:90", now - 5_000);
    stuck.state = OpState::Started;
    stuck.completed_at_ms = None;
    // Job one (a plain store): rank 0 alive and waiting, rank 1 silent for two minutes,
    // rank 2's value not a summary, and the watchdog's claim key beside them.
    let job = [
        (
            "ferrodist/flight/0",
            summary(
                0,
                now - 200,
                Some(completed("WORLD", 811, "train.py:88", now - 6_000)),
                vec![stuck],
            ),
        ),
        (
            "ferrodist/flight/1",
            summary(
                1,
                now - 120_000,
                Some(completed("WORLD", 700, "train.py:88", now - 121_000)),
                vec![],
            ),
        ),
        ("ferrodist/flight/2", "{\"version\":1,\"rank\":".into()),
        ("ferrodist/flight/logged/WORLD:812", "1".into()),
        // Job two, under a prefix store's prefix, with a hostile group name.
        (
            "jobB/ferrodist/flight/0",
            summary(0, now, Some(completed("G\"}\n9", 3, "b.py:1", now)), vec![]),
        ),
    ];
    for (key, value) in &job {
        store.set(key, value.as_bytes()).unwrap();
    }
    applied(&store);

    let (status, page) = get(&served.metrics, "/flight");
    assert_eq!(status, "HTTP/1.1 200 OK");
    // Ages are read at the scrape, a moment after the set: the page's are compared without
    // their figures here, the metrics' with bounds below.
    for line in [
        "job (no prefix): 3 rank(s)",
        "  rank 0: heartbeat # s ago  (host node-7, pid 1000)",
        "    last completed: all_reduce #811 on WORLD at train.py:88, # s ago",
        "    pending: 1 op(s); oldest all_reduce #812 on WORLD at train.py:90 (started, for # s)",
        "  rank 1: heartbeat # s ago  STALE  (host node-7, pid 1001)",
        "    last completed: all_reduce #700 on WORLD at train.py:88, # s ago",
        "job jobB/: 1 rank(s)",
        "    last completed: all_reduce #3 on G\"}?9 at b.py:1, # s ago",
        "malformed summaries skipped: 1",
    ] {
        let found = page.lines().any(|l| without_ages(l) == line);
        assert!(found, "{line:?} missing in\n{page}");
    }
    assert!(
        page.lines()
            .any(|l| l.starts_with("  rank 2: summary skipped: ")),
        "{page}"
    );

    let (status, metrics) = get(&served.metrics, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    for line in [
        "ferrodist_flight_ranks{job_prefix=\"\"} 3",
        "ferrodist_flight_ranks{job_prefix=\"jobB/\"} 1",
        "ferrodist_flight_last_completed_seq{job_prefix=\"\",rank=\"0\",group=\"WORLD\"} 811",
        "ferrodist_flight_last_completed_seq{job_prefix=\"jobB/\",rank=\"0\",group=\"G\\\"}\\n9\"} 3",
        "ferrodist_flight_pending_ops{job_prefix=\"\",rank=\"0\"} 1",
        "ferrodist_flight_pending_ops{job_prefix=\"\",rank=\"1\"} 0",
        "ferrodist_flight_malformed_summaries 1",
        "ferrodist_flight_ranks_not_shown 0",
        "ferrodist_store_keys 5",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line:?} missing in\n{metrics}");
    }
    let age = |rank: &str| -> f64 {
        let name =
            format!("ferrodist_flight_heartbeat_age_seconds{{job_prefix=\"\",rank=\"{rank}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&name)).unwrap();
        line[name.len()..].parse().unwrap()
    };
    assert!((0.2..5.0).contains(&age("0")), "{metrics}");
    assert!((120.0..125.0).contains(&age("1")), "{metrics}");
    // Every sample is one well-formed line: the hostile group name forged none.
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }

    // A rank that publishes again is read again: no caching between scrapes.
    store
        .set(
            "ferrodist/flight/1",
            summary(1, now_ms(), None, vec![]).as_bytes(),
        )
        .unwrap();
    applied(&store);
    let (_, page) = get(&served.metrics, "/flight");
    let rank1 = page.lines().find(|l| l.starts_with("  rank 1:")).unwrap();
    assert!(!rank1.contains("STALE"), "{page}");
}

#[test]
fn a_store_without_summaries_says_so_and_unknown_paths_name_the_page() {
    let served = serve(&[]);
    let (status, page) = get(&served.metrics, "/flight");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        page.contains("No flight recorder summaries in this store."),
        "{page}"
    );
    let (_, metrics) = get(&served.metrics, "/metrics");
    assert!(!metrics.contains("ferrodist_flight_"), "{metrics}");
    let (status, body) = get(&served.metrics, "/nope");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert!(body.contains("/flight"), "{body}");
}

#[test]
fn with_the_etcd_backend_the_page_says_the_view_is_not_available() {
    let endpoints = EtcdCluster::shared_endpoints().join(",");
    let backend = format!("etcd://{endpoints}/{}", fresh_job("live"));
    let served = serve(&["--backend".into(), backend]);
    let store = store_client(served.port);
    store
        .set(
            "ferrodist/flight/0",
            summary(0, now_ms(), None, vec![]).as_bytes(),
        )
        .unwrap();
    applied(&store);
    let (status, page) = get(&served.metrics, "/flight");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(page.contains("not available"), "{page}");
    assert!(page.contains("etcd"), "{page}");
    let (_, metrics) = get(&served.metrics, "/metrics");
    assert!(!metrics.contains("ferrodist_flight_"), "{metrics}");
}
