//! The store server with its state in etcd (`ferrodist-store --backend etcd://...`), against a
//! real 3-member etcd cluster: every wire operation, a stock client's view, two servers over one
//! prefix, and a server killed with SIGKILL and restarted on its port while a ferrodist client
//! keeps calling.

mod common;

use std::io::Write;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{frames, read_n};
use ferrodist::store::etcd::{EtcdEngine, EtcdStore};
use ferrodist::store::Store;
use ferrodist::tcp::codec::{Request, FERRODIST_PING, FERRODIST_PONG_DURABLE, VALIDATE_MAGIC};
use ferrodist::tcp::{Server, ServerConfig, TcpStore};

fn job() -> String {
    common::etcd::fresh_job("server")
}

fn etcd_store(prefix: &str) -> EtcdStore {
    common::etcd::shared_store(prefix)
}

/// A server in this process whose requests are served from etcd under `prefix`.
fn server(prefix: &str) -> Server {
    let config = ServerConfig {
        host: "127.0.0.1".into(),
        ..ServerConfig::default()
    };
    Server::start_with_engine(&config, EtcdEngine::new(etcd_store(prefix))).expect("starts")
}

fn client(port: u16) -> TcpStore {
    common::store_binary::store_client(port)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn names(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn every_wire_operation_is_served_from_etcd() {
    let prefix = job();
    let server = server(&prefix);
    let s = client(server.local_addr().port());
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap(), b"v");
    assert_eq!(s.add("n", 5).unwrap(), 5);
    assert_eq!(s.add("n", -2).unwrap(), 3);
    // compare_set's four cases.
    assert_eq!(s.compare_set("k", b"v", b"w").unwrap(), b"w");
    assert_eq!(s.compare_set("k", b"nope", b"x").unwrap(), b"w");
    assert_eq!(s.compare_set("gone", b"x", b"y").unwrap(), b"x");
    assert_eq!(s.compare_set("new", b"", b"y").unwrap(), b"y");
    assert!(s.check(&names(&["k", "n"])).unwrap());
    assert!(!s.check(&names(&["k", "gone"])).unwrap());
    s.append("log", b"ab").unwrap();
    s.append("log", b"cd").unwrap();
    assert_eq!(s.get("log").unwrap(), b"abcd");
    s.multi_set(&names(&["m1", "m2"]), &[b"1".to_vec(), b"2".to_vec()])
        .unwrap();
    assert_eq!(
        s.multi_get(&names(&["m1", "m2", "k"])).unwrap(),
        [b"1".to_vec(), b"2".to_vec(), b"w".to_vec()]
    );
    assert_eq!(s.num_keys().unwrap(), 6, "k n new log m1 m2");
    let mut keys = s.list_keys().unwrap();
    keys.sort();
    assert_eq!(keys, names(&["k", "log", "m1", "m2", "n", "new"]));
    assert!(s.delete_key("new").unwrap());
    assert!(!s.delete_key("new").unwrap());
    s.queue_push("q", b"first").unwrap();
    s.queue_push("q", b"second").unwrap();
    assert_eq!(s.queue_len("q").unwrap(), 2);
    assert!(
        s.check(&names(&["q"])).unwrap(),
        "a non-empty queue is present"
    );
    assert_eq!(s.queue_pop("q", false).unwrap(), b"first");
    assert_eq!(s.queue_pop("q", false).unwrap(), b"second");
    assert_eq!(s.queue_len("q").unwrap(), 0);
    s.barrier("b", 1, None).unwrap();
    // Everything is in etcd, under the wire names (torch's `/` prefix included).
    let direct = etcd_store(&prefix);
    assert_eq!(direct.get("/k").unwrap(), b"w");
    assert_eq!(direct.get("/n").unwrap(), b"3");
    assert_eq!(direct.get("/b").unwrap(), b"1", "BARRIER counts on its key");
    // A wait across connections: released by a set on another connection, not by polling.
    let waiter = client(server.local_addr().port());
    let setter = thread::spawn({
        let port = server.local_addr().port();
        move || {
            thread::sleep(Duration::from_millis(300));
            client(port).set("late", b"1").unwrap();
        }
    });
    waiter.wait(&names(&["late"]), None).unwrap();
    setter.join().unwrap();
    let err = waiter
        .wait(&names(&["never"]), Some(Duration::from_millis(300)))
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // The connection stays usable after its wait timed out (CANCEL_WAIT cancelled the watch).
    assert_eq!(waiter.get("late").unwrap(), b"1");
    direct.purge().unwrap();
}

#[test]
fn a_barrier_of_two_releases_both_through_two_servers() {
    let prefix = job();
    let (one, two) = (server(&prefix), server(&prefix));
    let first = client(one.local_addr().port());
    let second = client(two.local_addr().port());
    let waiting = thread::spawn(move || first.barrier("rendezvous", 2, None));
    thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "one arrival of two");
    second.barrier("rendezvous", 2, None).unwrap();
    waiting.join().unwrap().unwrap();
    etcd_store(&prefix).purge().unwrap();
}

/// A raw socket past torch's own handshake (VALIDATE, PING with a pid): a stock client.
fn stock(server: &Server) -> std::net::TcpStream {
    let stream = std::net::TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    (&stream)
        .write_all(&frames(&[
            Request::Validate {
                magic: VALIDATE_MAGIC,
            },
            Request::Ping { nonce: 4242 },
        ]))
        .unwrap();
    assert_eq!(read_n(&stream, 4), 4242u32.to_le_bytes(), "PING is echoed");
    stream
}

#[test]
fn two_servers_over_one_prefix_serve_one_state() {
    let prefix = job();
    let (one, two) = (server(&prefix), server(&prefix));
    // A stock client's WAIT on server two is released by a SET through server one.
    let mut waiter = stock(&two);
    waiter
        .write_all(&frames(&[
            Request::Wait {
                keys: vec![b("/shared")],
            },
            // A stock client's GET behind a pending WAIT is answered at once: empty.
            Request::Get { key: b("/shared") },
        ]))
        .unwrap();
    assert_eq!(read_n(&waiter, 8), 0u64.to_le_bytes());
    let mut setter = stock(&one);
    setter
        .write_all(&frames(&[
            Request::Set {
                key: b("/shared"),
                value: b("v"),
            },
            Request::Add {
                key: b("/count"),
                delta: 2,
            },
        ]))
        .unwrap();
    assert_eq!(read_n(&setter, 8), 2i64.to_le_bytes());
    assert_eq!(read_n(&waiter, 1), [0], "STOP_WAITING");
    waiter
        .write_all(&frames(&[
            Request::Get { key: b("/shared") },
            Request::Add {
                key: b("/count"),
                delta: 3,
            },
        ]))
        .unwrap();
    assert_eq!(read_n(&waiter, 8), 1u64.to_le_bytes());
    assert_eq!(read_n(&waiter, 1), b"v");
    assert_eq!(read_n(&waiter, 8), 5i64.to_le_bytes());
    // ferrodist's client hears that the state outlives the server.
    let mut ours = common::raw(&two, true);
    ours.write_all(&frames(&[Request::Ping {
        nonce: FERRODIST_PING,
    }]))
    .unwrap();
    assert_eq!(read_n(&ours, 4), FERRODIST_PONG_DURABLE.to_le_bytes());
    etcd_store(&prefix).purge().unwrap();
}

#[test]
fn a_set_from_a_client_that_leaves_at_once_still_lands() {
    let prefix = job();
    let server = server(&prefix);
    for i in 0..20 {
        // torch's client sends SET without waiting for anything; a rank may exit right after.
        let stream = stock(&server);
        (&stream)
            .write_all(&frames(&[Request::Set {
                key: b(&format!("/left{i}")),
                value: b("v"),
            }]))
            .unwrap();
        drop(stream);
    }
    let reader = client(server.local_addr().port());
    for i in 0..20 {
        assert_eq!(reader.get(&format!("left{i}")).unwrap(), b"v");
    }
    etcd_store(&prefix).purge().unwrap();
}

fn spawn_binary(port: u16, prefix: &str) -> (Child, u16) {
    common::store_binary::spawn_store(port, Some(prefix))
}

#[test]
fn a_server_killed_and_restarted_serves_every_acknowledged_key() {
    let prefix = job();
    // The server picks its port (a port picked here and bound later could be taken between).
    let (mut first, port) = spawn_binary(0, &prefix);
    let writer = client(port);
    let reader = client(port);
    writer.set("k", b"v").unwrap();
    // SET has no reply: the ADD's reply is the acknowledgement of both (requests are served in
    // order, so the SET was committed to etcd before the ADD was served).
    assert_eq!(writer.add("n", 5).unwrap(), 5);
    first.kill().unwrap(); // SIGKILL: nothing is flushed or handed over
    first.wait().unwrap();
    // Started again a second later, on the same port; the reader's next call, made while no
    // server listens, reconnects to it within its timeout.
    let restarted = thread::spawn({
        let prefix = prefix.clone();
        move || {
            thread::sleep(Duration::from_secs(1));
            spawn_binary(port, &prefix).0
        }
    });
    let started = Instant::now();
    assert_eq!(reader.get("k").unwrap(), b"v");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "served before the restart?"
    );
    assert_eq!(reader.add("n", 1).unwrap(), 6);
    assert_eq!(writer.get("n").unwrap(), b"6", "the writer reconnects too");
    let mut second = restarted.join().unwrap();
    // A second instance beside it, on another port, serves the same keys.
    let (mut beside, other) = spawn_binary(0, &prefix);
    let third = client(other);
    assert_eq!(third.get("k").unwrap(), b"v");
    assert_eq!(third.add("n", 1).unwrap(), 7);
    assert_eq!(reader.get("n").unwrap(), b"7");
    for child in [&mut second, &mut beside] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    etcd_store(&prefix).purge().unwrap();
}
