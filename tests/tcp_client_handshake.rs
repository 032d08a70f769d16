//! The client's handshake as a peer sees it: torch's VALIDATE and PING with the process id as
//! nonce first (what torch's own protocol test reads off the wire), then ferrodist's marker PING
//! in the same write; and a connect that neither fails nor stalls against a peer that answers
//! torch's handshake and nothing more. Also: a connect that gives up says why the attempts
//! failed, not that the last one ran out of time.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use ferrodist::error::Error;
use ferrodist::store::Deadline;
use ferrodist::tcp::client::Client;
use ferrodist::tcp::codec::{Request, FERRODIST_PING, VALIDATE_MAGIC};

use common::{frames, start_server};

/// How the fake peer ends the exchange after echoing the pid.
#[derive(Clone, Copy)]
enum After {
    /// Closes at once, the marker unread (as a test that checks torch's handshake does).
    Close,
    /// Echoes the marker too, as every stock server answers a PING.
    EchoMarker,
    /// Answers nothing more and keeps the connection open for a while.
    Silence,
}

/// A one-connection peer that reads torch's handshake, echoes the PING's nonce and then does
/// `after`; it returns the bytes it read (the handshake, and the marker where it read it).
fn fake_peer(after: After) -> (u16, thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut handshake = vec![0u8; 10];
        conn.read_exact(&mut handshake).unwrap();
        conn.write_all(&handshake[6..10]).unwrap();
        match after {
            After::Close => {}
            After::EchoMarker => {
                let mut marker = [0u8; 5];
                conn.read_exact(&mut marker).unwrap();
                conn.write_all(&marker[1..]).unwrap();
                handshake.extend_from_slice(&marker);
                // Stays until the client leaves.
                let _ = conn.read(&mut [0u8; 1]);
            }
            After::Silence => thread::sleep(Duration::from_secs(3)),
        }
        handshake
    });
    (port, peer)
}

fn torchs_handshake() -> Vec<u8> {
    frames(&[
        Request::Validate {
            magic: VALIDATE_MAGIC,
        },
        Request::Ping {
            nonce: std::process::id(),
        },
    ])
}

#[test]
fn a_peer_reads_torchs_handshake_with_the_pid_as_nonce_then_the_marker() {
    let (port, peer) = fake_peer(After::EchoMarker);
    let client = Client::connect("127.0.0.1", port, Duration::from_secs(10)).expect("connects");
    assert!(!client.is_ferrodist_server(), "the marker was echoed");
    drop(client);
    let seen = peer.join().unwrap();
    let mut expected = torchs_handshake();
    expected.extend(frames(&[Request::Ping {
        nonce: FERRODIST_PING,
    }]));
    assert_eq!(seen, expected);
}

#[test]
fn a_peer_that_closes_after_torchs_handshake_does_not_fail_the_connect() {
    let (port, peer) = fake_peer(After::Close);
    let started = Instant::now();
    Client::connect("127.0.0.1", port, Duration::from_secs(10)).expect("connects");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(peer.join().unwrap(), torchs_handshake());
}

#[test]
fn a_peer_that_answers_only_torchs_handshake_delays_the_connect_a_moment_at_most() {
    let (port, _peer) = fake_peer(After::Silence);
    let started = Instant::now();
    let client = Client::connect("127.0.0.1", port, Duration::from_secs(10)).expect("connects");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "connect took {took:?}");
    assert!(!client.is_ferrodist_server());
}

#[test]
fn ferrodists_server_is_known_as_such_from_the_handshake() {
    let server = start_server();
    let port = server.local_addr().port();
    let client = Client::connect("127.0.0.1", port, Duration::from_secs(10)).expect("connects");
    assert!(client.is_ferrodist_server());
    assert!(!client.is_durable_server());
}

#[test]
fn a_connect_that_gives_up_names_the_refusal_not_the_last_attempts_lack_of_time() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // bound and dropped: nothing listens there now
    for millis in [150, 400, 700, 1000] {
        let deadline = Deadline::after(Duration::from_millis(millis));
        let err = Client::connect_until("127.0.0.1", port, deadline, None)
            .err()
            .expect("nothing listens");
        assert!(matches!(err, Error::NetworkTimeout(_)), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("Connection refused"), "{message}");
    }
}
