//! `TcpStore` against servers of older torch, which close the connection on an opcode they do
//! not know: BARRIER (18) before torch 2.13, PING (13) too in torch 2.4. A proxy in front of
//! ferrodist's server does the same (and answers PING as torch does, by echoing it), so the
//! store must connect without PING and fall back to torch's add + wait barrier.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use ferrodist::store::Store;
use ferrodist::tcp::codec::{decode_request, Limits, Reply, Request};
use ferrodist::tcp::{TcpStore, TcpStoreOptions};

/// Which torch server the proxy plays.
#[derive(Clone, Copy, PartialEq)]
enum Torch {
    /// 2.11: no BARRIER.
    V2_11,
    /// 2.4: no BARRIER, no PING.
    V2_4,
}

/// A listener that forwards to `upstream` as a torch server of `era` would answer: a request
/// that server lacks closes the connection, every other passes. Returns its address and the
/// number of requests it refused.
fn old_server_in_front_of(upstream: SocketAddr, era: Torch) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(AtomicUsize::new(0));
    let counter = refused.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let client = client.unwrap();
            let server = TcpStream::connect(upstream).unwrap();
            let counter = counter.clone();
            let (to_client, from_server) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || copy_replies(from_server, to_client));
            thread::spawn(move || filter_requests(client, server, era, &counter));
        }
    });
    (addr, refused)
}

fn copy_replies(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
}

fn filter_requests(
    mut client: TcpStream,
    mut server: TcpStream,
    era: Torch,
    refused: &AtomicUsize,
) {
    let mut input = BytesMut::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        input.extend_from_slice(&chunk[..n]);
        let mut out = BytesMut::new();
        while let Some(request) = decode_request(&mut input, &Limits::UNLIMITED).unwrap() {
            let unknown = match request {
                Request::Barrier { .. } => true,
                Request::Ping { .. } => era == Torch::V2_4,
                _ => false,
            };
            match request {
                _ if unknown => {
                    refused.fetch_add(1, Ordering::SeqCst);
                    let _ = server.write_all(&out);
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                    return;
                }
                // A torch server echoes every nonce (ferrodist's would say it is ferrodist).
                // The handshake's PING is its first request with a reply, so answering it here
                // keeps the replies in order.
                Request::Ping { nonce } => {
                    let mut echo = BytesMut::new();
                    Reply::Nonce(nonce).encode(&mut echo);
                    let _ = client.write_all(&echo);
                }
                other => other.encode(&mut out),
            }
        }
        if server.write_all(&out).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}

fn store_at(addr: SocketAddr, timeout: Duration) -> TcpStore {
    TcpStore::new(TcpStoreOptions {
        host: addr.ip().to_string(),
        port: addr.port(),
        timeout,
        ..TcpStoreOptions::default()
    })
    .expect("connects")
}

#[test]
fn without_barrier_the_store_uses_torchs_add_wait_barrier() {
    let server = common::start_server();
    let (old, refused) = old_server_in_front_of(server.local_addr(), Torch::V2_11);
    let members: Vec<_> = (0..3)
        .map(|_| {
            thread::spawn(move || {
                let store = store_at(old, Duration::from_secs(10));
                store.barrier("b", 3, None).map(|()| store)
            })
        })
        .collect();
    let stores: Vec<TcpStore> = members
        .into_iter()
        .map(|m| m.join().unwrap().expect("released"))
        .collect();
    // Each store tried BARRIER twice (its connection, then a fresh one) before falling back.
    assert_eq!(refused.load(Ordering::SeqCst), 6);

    // torch's keys, written through the old server; the BARRIER counter never reached it.
    let direct = store_at(server.local_addr(), Duration::from_secs(10));
    assert_eq!(direct.get("b/num_members").unwrap(), b"3");
    assert_eq!(direct.get("b/last_member").unwrap(), b"1");
    assert!(!direct.check(&["b".into()]).unwrap());

    // Learnt once: later barriers go straight to add + wait, and time out like BARRIER does.
    stores[0].barrier("solo", 1, None).unwrap();
    let err = stores[1]
        .barrier("lonely", 2, Some(Duration::from_millis(100)))
        .unwrap_err();
    assert_eq!(err.to_string(), "barrier timeout after 100ms, key: lonely");
    assert_eq!(refused.load(Ordering::SeqCst), 6);
    // The fallback's connections are healthy: ordinary calls go on.
    stores[2].set("after", b"1").unwrap();
    assert_eq!(stores[0].get("after").unwrap(), b"1");
}

#[test]
fn with_barrier_the_store_sends_it() {
    let server = common::start_server();
    let store = store_at(server.local_addr(), Duration::from_secs(10));
    store.barrier("native", 1, None).unwrap();
    // BARRIER's counter lives under the key itself; the fallback's keys were not written.
    assert_eq!(store.get("native").unwrap(), b"1");
    assert!(!store.check(&["native/num_members".into()]).unwrap());
}

#[test]
fn a_dead_server_fails_the_barrier_instead_of_falling_back() {
    let server = common::start_server();
    let store = store_at(server.local_addr(), Duration::from_secs(2));
    store.set("k", b"v").unwrap();
    // Stops listening at once (a reconnect is refused) and ends every connection.
    server.stop();
    let err = store.barrier("b", 2, None).unwrap_err();
    assert!(
        matches!(
            err,
            ferrodist::Error::Network(_) | ferrodist::Error::ConnectionClosed { .. }
        ),
        "{err:?}"
    );
    assert!(!err.to_string().contains("barrier timeout"), "{err}");
}

#[test]
fn a_server_without_ping_is_reached_with_validate_alone() {
    let server = common::start_server();
    let (old, refused) = old_server_in_front_of(server.local_addr(), Torch::V2_4);
    let store = store_at(old, Duration::from_secs(10));
    // The VALIDATE + PING handshake was refused once; VALIDATE alone then connected.
    assert_eq!(refused.load(Ordering::SeqCst), 1);
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
    assert_eq!(store.add("n", 2).unwrap(), 2);
    store.barrier("b", 1, None).unwrap();
    let direct = store_at(server.local_addr(), Duration::from_secs(10));
    assert_eq!(direct.get("b/last_member").unwrap(), b"1");
    // No key was written by the handshake's probe.
    assert_eq!(
        direct.num_keys().unwrap(),
        4,
        "k, n, b/num_members, b/last_member"
    );
}
