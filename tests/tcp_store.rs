//! `TcpStore` (the blocking, torch-compatible client) against ferrodist's server.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrodist::store::Store;
use ferrodist::tcp::{TcpStore, TcpStoreOptions};
use ferrodist::Error;

fn master(world_size: Option<u64>) -> TcpStore {
    TcpStore::new(TcpStoreOptions {
        is_master: true,
        world_size,
        timeout: Duration::from_secs(10),
        ..TcpStoreOptions::default()
    })
    .expect("master starts")
}

fn worker(port: u16, timeout: Duration) -> TcpStore {
    TcpStore::new(TcpStoreOptions {
        port,
        timeout,
        ..TcpStoreOptions::default()
    })
    .expect("connects")
}

#[test]
fn every_operation_round_trips() {
    let store = master(None);
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
    assert_eq!(store.add("n", 5).unwrap(), 5);
    assert_eq!(store.add("n", -2).unwrap(), 3);
    assert_eq!(store.compare_set("k", b"v", b"w").unwrap(), b"w");
    assert_eq!(store.compare_set("k", b"x", b"y").unwrap(), b"w");
    assert_eq!(store.compare_set("new", b"x", b"y").unwrap(), b"x");
    assert!(store.check(&["k".into(), "n".into()]).unwrap());
    assert!(!store.check(&["absent".into()]).unwrap());
    store.append("a", b"1").unwrap();
    store.append("a", b"2").unwrap();
    store
        .multi_set(&["m1".into(), "m2".into()], &[b"x".to_vec(), b"y".to_vec()])
        .unwrap();
    assert_eq!(
        store.multi_get(&["a".into(), "m2".into()]).unwrap(),
        vec![b"12".to_vec(), b"y".to_vec()]
    );
    assert_eq!(store.num_keys().unwrap(), 5);
    let mut keys = store.list_keys().unwrap();
    keys.sort();
    assert_eq!(keys, ["a", "k", "m1", "m2", "n"]);
    assert!(store.delete_key("k").unwrap());
    assert!(!store.delete_key("k").unwrap());
    store.queue_push("q", b"e1").unwrap();
    store.queue_push("q", b"e2").unwrap();
    assert_eq!(store.queue_len("q").unwrap(), 2);
    assert_eq!(store.queue_pop("q", true).unwrap(), b"e1");
    assert_eq!(store.queue_pop("q", false).unwrap(), b"e2");
    assert!(matches!(
        store.queue_pop("q", false),
        Err(Error::QueueEmpty)
    ));
    store.barrier("solo", 1, None).unwrap();
}

#[test]
fn a_timed_out_wait_names_keys_and_leaves_the_store_usable() {
    let store = master(None);
    let started = Instant::now();
    let err = store
        .wait(&["x".into(), "y".into()], Some(Duration::from_millis(100)))
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(err.to_string(), "wait timeout after 100ms, keys: /x, /y");
    let err = store
        .get_timeout("x", Duration::from_millis(50))
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    store.set("x", b"1").unwrap();
    assert_eq!(store.get("x").unwrap(), b"1");
    assert_eq!(store.add("c", 1).unwrap(), 1);
}

#[test]
fn a_wait_resumed_slice_by_slice_is_released_by_a_later_set() {
    let store = master(None);
    let other = worker(store.port(), Duration::from_secs(10));
    for _ in 0..3 {
        assert!(store
            .get_timeout("late", Duration::from_millis(20))
            .unwrap_err()
            .is_timeout());
    }
    other.set("late", b"now").unwrap();
    assert_eq!(
        store
            .get_timeout("late", Duration::from_millis(2000))
            .unwrap(),
        b"now"
    );
    assert_eq!(store.server().unwrap().db().pending_waits(), 0);
}

#[test]
fn the_master_waits_for_every_worker_then_returns() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let opts = TcpStoreOptions {
        port,
        world_size: Some(3),
        timeout: Duration::from_secs(20),
        ..TcpStoreOptions::default()
    };
    let master_opts = TcpStoreOptions {
        is_master: true,
        ..opts.clone()
    };
    let master = thread::spawn(move || TcpStore::new(master_opts));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let o = opts.clone();
            thread::spawn(move || TcpStore::new(o))
        })
        .collect();
    let master = master.join().unwrap().expect("all joined");
    for w in workers {
        w.join().unwrap().expect("worker joined");
    }
    assert!(master
        .get_timeout("missing", Duration::from_millis(1))
        .unwrap_err()
        .is_timeout());
    assert_eq!(
        master.num_keys().unwrap(),
        1,
        "init/ is counted, as in torch"
    );
}

#[test]
fn a_master_missing_workers_times_out_with_torchs_message() {
    let err = TcpStore::new(TcpStoreOptions {
        is_master: true,
        world_size: Some(2),
        timeout: Duration::from_millis(300),
        ..TcpStoreOptions::default()
    })
    .err()
    .expect("times out");
    assert!(err.to_string().contains("1/2 clients joined"), "{err}");
}

#[test]
fn barrier_releases_every_member_and_times_out_alone() {
    let store = Arc::new(master(None));
    let port = store.port();
    let members: Vec<_> = (0..3)
        .map(|_| thread::spawn(move || worker(port, Duration::from_secs(10)).barrier("b", 3, None)))
        .collect();
    for m in members {
        m.join().unwrap().unwrap();
    }
    let err = store
        .barrier("lonely", 2, Some(Duration::from_millis(100)))
        .unwrap_err();
    assert_eq!(err.to_string(), "barrier timeout after 100ms, key: lonely");
    assert_eq!(
        store.get("lonely").unwrap(),
        b"1",
        "the arrival stays counted, as in torch"
    );
}

#[test]
fn a_stopped_server_fails_every_call_fast_with_a_network_error() {
    let mut host = Some(master(None));
    let port = host.as_ref().unwrap().port();
    let client = worker(port, Duration::from_secs(30));
    client.set("k", b"v").unwrap();
    drop(host.take());
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let network = |e: Error| matches!(e, Error::ConnectionClosed { .. } | Error::Network(_));
    assert!(network(client.set("k", b"v").unwrap_err()));
    let e = client.get("k").unwrap_err();
    assert!(
        matches!(e, Error::ConnectionClosed { .. } | Error::Network(_)),
        "{e:?}"
    );
    assert!(network(client.add("n", 1).unwrap_err()));
    assert!(network(client.wait(&["k".into()], None).unwrap_err()));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn an_ip_literal_host_binds_only_that_address() {
    let store = master(None);
    let addr = store.server().unwrap().local_addr();
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
}

#[test]
fn a_clone_is_a_new_connection_to_the_same_server() {
    let store = master(None);
    let clone = store.clone_store().unwrap();
    clone.set("shared", b"1").unwrap();
    assert_eq!(store.get("shared").unwrap(), b"1");
}
