//! A durable server keeps its waiters (issue 27 item 8): a ferrodist client blocked in a wait
//! when `ferrodist-store --backend etcd://...` is SIGKILLed gets its keys once the server is
//! back on its port, within the wait's deadline, and times out at that deadline when it never
//! comes back. Against an in-memory server (or an in-memory one that took the port) a lost
//! connection still fails the wait at once, and a request that changes state is never re-sent.
//!
//! Real processes throughout: the `ferrodist-store` binary of this build, a 3-member etcd
//! cluster (tests/common/etcd.rs), and for the re-send check a scripted server on a socket.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrodist::error::Error;
use ferrodist::store::Store;
use ferrodist::tcp::codec::{
    decode_request, Limits, Request, FERRODIST_PING, FERRODIST_PONG_DURABLE, NOT_READY,
};
use ferrodist::tcp::TcpStore;

/// How long after the kill a waiter may take to notice (generous: two shared cores).
const NOTICE: Duration = Duration::from_millis(1500);

/// The longest a client may take to find a restarted durable server: it knocks at most every
/// 2 s (conn_pool.rs's `RECONNECT_MAX`), jittered by up to 1.5x.
const LONGEST_RECONNECT_PAUSE: Duration = Duration::from_secs(3);

fn spawn_server(port: u16, prefix: Option<&str>) -> (Child, u16) {
    common::store_binary::spawn_store(port, prefix)
}

fn kill(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL: nothing is flushed, every socket just closes
    child.wait().unwrap();
}

fn client(port: u16) -> TcpStore {
    common::store_binary::store_client(port)
}

fn names(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// A client connected to `port` that is blocked in a wait by the time this returns: it has
/// been served once, and its wait was sent a moment ago.
fn blocked<T: Send + 'static>(
    port: u16,
    wait: impl FnOnce(&TcpStore) -> T + Send + 'static,
) -> thread::JoinHandle<(T, Instant)> {
    let store = client(port);
    assert!(!store.check(&names(&["warm"])).unwrap());
    let handle = thread::spawn(move || {
        let result = wait(&store);
        (result, Instant::now())
    });
    thread::sleep(Duration::from_millis(500));
    handle
}

#[test]
fn waits_blocked_when_a_durable_server_is_killed_return_after_its_restart() {
    let prefix = common::etcd::fresh_job("waiters");
    let (mut first, port) = spawn_server(0, Some(&prefix));
    let deadline = Duration::from_secs(25);
    let wait_two = blocked(port, move |s| s.wait(&names(&["a", "b"]), Some(deadline)));
    let get_one = blocked(port, move |s| s.get_timeout("b", deadline));
    let multi = blocked(port, |s| s.multi_get(&names(&["a", "b"])));
    let started = Instant::now();
    kill(&mut first);
    thread::sleep(Duration::from_secs(1));
    let finished = [
        wait_two.is_finished(),
        get_one.is_finished(),
        multi.is_finished(),
    ];
    assert_eq!(finished, [false; 3], "a waiter failed when its server died");
    let (mut second, again) = spawn_server(port, Some(&prefix));
    assert_eq!(again, port);
    let back_at = Instant::now();
    let setter = client(port);
    setter.set("a", b"1").unwrap();
    thread::sleep(Duration::from_millis(300));
    assert!(!wait_two.is_finished(), "released before every key was set");
    setter.set("b", b"2").unwrap();
    let (waited, at) = wait_two.join().unwrap();
    waited.expect("the wait for two keys returns");
    assert!(at.duration_since(back_at) < LONGEST_RECONNECT_PAUSE + NOTICE);
    let (got, _) = get_one.join().unwrap();
    assert_eq!(got.expect("the get returns"), b"2");
    let (values, _) = multi.join().unwrap();
    assert_eq!(values.expect("the multi_get returns"), [b"1", b"2"]);
    assert!(started.elapsed() < deadline);
    kill(&mut second);
    common::etcd::shared_store(&prefix).purge().unwrap();
}

#[test]
fn a_wait_whose_durable_server_never_returns_times_out_at_its_deadline() {
    let prefix = common::etcd::fresh_job("waiters");
    let (mut server, port) = spawn_server(0, Some(&prefix));
    let deadline = Duration::from_secs(4);
    let started = Instant::now();
    let waiter = blocked(port, move |s| s.wait(&names(&["never"]), Some(deadline)));
    kill(&mut server);
    let (waited, at) = waiter.join().unwrap();
    let took = at.duration_since(started);
    assert!(
        took >= deadline && took < deadline + NOTICE,
        "timed out after {took:?}, not at {deadline:?}"
    );
    let err = waited.expect_err("no server, no key");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("wait timeout after 4000ms, keys: /never"),
        "{message}"
    );
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    common::etcd::shared_store(&prefix).purge().unwrap();
}

#[test]
fn a_wait_on_an_in_memory_server_fails_at_once_when_it_dies() {
    let (mut server, port) = spawn_server(0, None);
    let waiter = blocked(port, |s| {
        s.wait(&names(&["k"]), Some(Duration::from_secs(20)))
    });
    let killed = Instant::now();
    kill(&mut server);
    let (waited, at) = waiter.join().unwrap();
    assert!(at.duration_since(killed) < NOTICE, "the keys died with it");
    let err = waited.expect_err("the server is gone");
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err:?}");
}

#[test]
fn a_wait_fails_when_an_in_memory_server_takes_the_durable_ones_port() {
    let prefix = common::etcd::fresh_job("waiters");
    let (mut durable, port) = spawn_server(0, Some(&prefix));
    let deadline = Duration::from_secs(20);
    let waiter = blocked(port, move |s| s.wait(&names(&["k"]), Some(deadline)));
    kill(&mut durable);
    let (mut plain, again) = spawn_server(port, None);
    assert_eq!(again, port);
    let started = Instant::now();
    let (waited, at) = waiter.join().unwrap();
    assert!(at.duration_since(started) < Duration::from_secs(5));
    let err = waited.expect_err("the new server has none of the keys");
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err:?}");
    kill(&mut plain);
    common::etcd::shared_store(&prefix).purge().unwrap();
}

/// What a scripted server saw: connections accepted, and requests it closed a connection on.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    closed_on: AtomicUsize,
}

/// A scripted server that says its state outlives it, answers CHECK with "not there" and
/// closes the connection on every request `close_on` picks (after counting it).
fn scripted(close_on: fn(&Request) -> bool) -> (u16, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counts.connections.fetch_add(1, Ordering::SeqCst);
            let counts = counts.clone();
            thread::spawn(move || {
                let mut input = BytesMut::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Ok(Some(request)) = decode_request(&mut input, &Limits::UNLIMITED) {
                        if close_on(&request) {
                            counts.closed_on.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        let answer: Vec<u8> = match request {
                            Request::Ping {
                                nonce: FERRODIST_PING,
                            } => FERRODIST_PONG_DURABLE.to_le_bytes().to_vec(),
                            Request::Ping { nonce } => nonce.to_le_bytes().to_vec(),
                            Request::Check { .. } => vec![NOT_READY],
                            _ => Vec::new(),
                        };
                        if stream.write_all(&answer).is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => input.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (port, seen)
}

#[test]
fn an_add_whose_durable_server_drops_the_connection_is_sent_once() {
    let (port, seen) = scripted(|r| matches!(r, Request::Add { .. }));
    let store = client(port);
    let err = store
        .add("n", 1)
        .expect_err("the connection closed under it");
    assert!(matches!(err, Error::ConnectionClosed { .. }), "{err:?}");
    let adds = seen.closed_on.load(Ordering::SeqCst);
    assert_eq!(adds, 1, "an ADD may have been applied: never re-sent");
}

#[test]
fn a_durable_server_that_drops_every_wait_is_retried_with_backoff_until_the_deadline() {
    let (port, seen) = scripted(|r| matches!(r, Request::Wait { .. }));
    let store = client(port);
    let deadline = Duration::from_secs(3);
    let started = Instant::now();
    let err = store
        .wait(&names(&["k"]), Some(deadline))
        .expect_err("never released");
    let took = started.elapsed();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(took >= deadline && took < deadline + NOTICE, "{took:?}");
    // Pauses of 100 ms growing by half each time (jittered): about 8 in 3 s, not a spin.
    let waits = seen.closed_on.load(Ordering::SeqCst);
    assert!((3..=20).contains(&waits), "the wait was sent {waits} times");
    assert_eq!(seen.connections.load(Ordering::SeqCst), waits);
}
