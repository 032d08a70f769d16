//! EtcdStore against a real 3-member etcd cluster: torch's store semantics, watch-based waits
//! (including a write that lands between a wait's read and its watch), exactly-once counters
//! under contention, job prefixes, and a wait that outlives the leader.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::etcd::EtcdCluster;
use ferrodist::error::Error;
use ferrodist::store::etcd::{EtcdOptions, EtcdStore, Layout};
use ferrodist::store::{PrefixStore, Store};

static JOBS: AtomicUsize = AtomicUsize::new(0);

/// A fresh job prefix, so tests sharing the cluster never see each other's keys.
fn job() -> String {
    format!(
        "rust-{}-{}",
        std::process::id(),
        JOBS.fetch_add(1, Ordering::Relaxed)
    )
}

fn options(endpoints: Vec<String>, prefix: &str) -> EtcdOptions {
    EtcdOptions {
        endpoints,
        prefix: prefix.to_owned(),
        timeout: Duration::from_secs(10),
        user: None,
        tls: None,
    }
}

fn store(prefix: &str) -> EtcdStore {
    EtcdStore::connect(&options(EtcdCluster::shared_endpoints(), prefix)).expect("connects")
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|k| k.to_string()).collect()
}

#[test]
fn key_value_calls_answer_as_torchs_stores() {
    let s = store(&job());
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap(), b"v");
    assert_eq!(s.add("n", 5).unwrap(), 5);
    assert_eq!(s.add("n", -2).unwrap(), 3);
    assert_eq!(s.get("n").unwrap(), b"3", "counters are decimal text");
    // compare_set's four cases.
    assert_eq!(s.compare_set("k", b"v", b"w").unwrap(), b"w");
    assert_eq!(s.compare_set("k", b"nope", b"x").unwrap(), b"w");
    assert_eq!(s.compare_set("gone", b"x", b"y").unwrap(), b"x");
    assert!(!s.check(&keys(&["gone"])).unwrap());
    assert_eq!(s.compare_set("new", b"", b"y").unwrap(), b"y");
    // add: an empty value counts from 0 (HashStore), a non-number is refused unchanged.
    s.set("empty", b"").unwrap();
    assert_eq!(s.add("empty", 2).unwrap(), 2);
    assert!(matches!(s.add("k", 1), Err(Error::InvalidArgument(_))));
    assert_eq!(s.get("k").unwrap(), b"w");
    assert!(s.check(&keys(&["k", "n"])).unwrap());
    assert!(s.delete_key("k").unwrap());
    assert!(!s.delete_key("k").unwrap());
    s.append("log", b"a").unwrap();
    s.append("log", b"b").unwrap();
    assert_eq!(s.get("log").unwrap(), b"ab");
    s.multi_set(&keys(&["m1", "m2"]), &[b"1".to_vec(), b"2".to_vec()])
        .unwrap();
    assert_eq!(s.multi_get(&keys(&["m1", "m2"])).unwrap(), [b"1", b"2"]);
    let mut listed = s.list_keys().unwrap();
    listed.sort();
    assert_eq!(listed, keys(&["empty", "log", "m1", "m2", "n", "new"]));
    assert_eq!(s.num_keys().unwrap(), 6);
}

#[test]
fn queues_are_a_namespace_of_their_own() {
    let s = store(&job());
    s.set("q", b"plain").unwrap();
    s.queue_push("q", b"a").unwrap();
    s.queue_push("q", b"").unwrap();
    assert_eq!(s.queue_len("q").unwrap(), 2);
    assert_eq!(s.num_keys().unwrap(), 1, "queues are not keys");
    assert_eq!(s.queue_pop("q", false).unwrap(), b"a");
    assert_eq!(s.queue_pop("q", true).unwrap(), b"");
    assert!(matches!(s.queue_pop("q", false), Err(Error::QueueEmpty)));
    assert_eq!(s.get("q").unwrap(), b"plain");
    // A non-empty queue counts as present for check and wait.
    s.queue_push("only-queue", b"x").unwrap();
    assert!(s.check(&keys(&["only-queue"])).unwrap());
    s.wait(&keys(&["only-queue"]), Some(Duration::from_secs(1)))
        .unwrap();
}

#[test]
fn wait_wakes_on_a_write_from_another_client() {
    let prefix = job();
    let (waiter, writer) = (store(&prefix), store(&prefix));
    let started = Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        writer.set("a", b"1").unwrap();
        writer.queue_push("b", b"x").unwrap();
    });
    waiter
        .wait(&keys(&["a", "b"]), Some(Duration::from_secs(10)))
        .unwrap();
    t.join().unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn a_set_between_the_read_and_the_watch_still_ends_the_wait() {
    let prefix = job();
    let s = store(&prefix);
    let endpoints = EtcdCluster::shared_endpoints();
    let etcd_key = Layout::new(&prefix).unwrap().value("late");
    let gap = async move {
        let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
        client.put(etcd_key, "1", None).await.unwrap();
    };
    // A wait that missed the write would time out: the key is never written again.
    s.wait_with_gap(&keys(&["late"]), Duration::from_secs(10), gap)
        .expect("the write in the gap ends the wait");
}

#[test]
fn a_wait_times_out_naming_only_the_missing_keys() {
    let s = store(&job());
    s.set("here", b"1").unwrap();
    let started = Instant::now();
    let err = s
        .wait(&keys(&["here", "absent"]), Some(Duration::from_millis(300)))
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(err.is_timeout());
    let text = err.to_string();
    assert!(text.contains("absent") && !text.contains("here"), "{text}");
    let err = s
        .get_timeout("absent", Duration::from_millis(100))
        .unwrap_err();
    assert!(
        err.to_string().starts_with("get timeout after 100ms"),
        "{err}"
    );
}

#[test]
fn concurrent_adds_each_count_exactly_once() {
    let prefix = job();
    let seen: Vec<i64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let s = store(&prefix);
                scope.spawn(move || (0..25).map(|_| s.add("c", 1).unwrap()).collect::<Vec<_>>())
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let unique: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique, (1..=200).collect::<HashSet<i64>>());
    assert_eq!(store(&prefix).get("c").unwrap(), b"200");
}

#[test]
fn jobs_under_different_prefixes_are_apart_and_purge_removes_one() {
    let (a, b) = (store(&job()), store(&job()));
    a.set("k", b"a").unwrap();
    b.set("k", b"b").unwrap();
    a.queue_push("q", b"x").unwrap();
    assert_eq!(a.get("k").unwrap(), b"a");
    assert!(a.purge().unwrap() >= 2);
    assert_eq!(a.num_keys().unwrap(), 0);
    assert_eq!(a.queue_len("q").unwrap(), 0);
    assert_eq!(b.get("k").unwrap(), b"b");
}

#[test]
fn prefix_store_and_clones_work_on_it_unchanged() {
    let s: Arc<dyn Store> = Arc::new(store(&job()));
    let view = PrefixStore::new("pg", Arc::clone(&s));
    view.set("k", b"v").unwrap();
    assert_eq!(s.get("pg/k").unwrap(), b"v");
    let clone = s.clone_store().unwrap();
    clone.set_timeout(Duration::from_millis(50));
    assert_eq!(
        s.timeout(),
        Duration::from_secs(10),
        "a clone has its own timeout"
    );
    assert_eq!(clone.get("pg/k").unwrap(), b"v");
    s.barrier("b", 1, Some(Duration::from_secs(2))).unwrap();
}

#[test]
fn an_unreachable_cluster_fails_within_the_timeout() {
    let dead = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let mut opts = options(vec![dead], &job());
    opts.timeout = Duration::from_millis(500);
    let started = Instant::now();
    let outcome = EtcdStore::connect(&opts).and_then(|s| s.set("k", b"v"));
    let err = outcome.expect_err("nothing listens there");
    assert!(
        matches!(err, Error::NetworkTimeout(_) | Error::Network(_)),
        "{err:?}"
    );
    // A call's deadline is at least 5 s (an election's worth), whatever the store timeout.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(EtcdStore::connect(&options(Vec::new(), "x")).is_err());
}

#[test]
fn a_wait_and_its_writer_outlive_the_leader() {
    let mut cluster = EtcdCluster::start(3);
    let prefix = job();
    let opts = options(cluster.endpoints(), &prefix);
    let (waiter, writer) = (
        EtcdStore::connect(&opts).unwrap(),
        EtcdStore::connect(&opts).unwrap(),
    );
    writer.set("before", b"1").unwrap();
    let t =
        std::thread::spawn(move || waiter.wait(&keys(&["after"]), Some(Duration::from_secs(20))));
    std::thread::sleep(Duration::from_millis(300));
    let leader = cluster.leader().expect("a leader");
    cluster.kill(leader);
    writer
        .set("after", b"2")
        .expect("a write through the election");
    t.join().unwrap().expect("the wait sees it");
    assert_eq!(
        writer.get("before").unwrap(),
        b"1",
        "acknowledged before the kill"
    );
}
