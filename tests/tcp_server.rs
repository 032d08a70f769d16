//! The server against raw bytes: handshake, pipelining, CANCEL_WAIT, limits, partial frames.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{frames, is_closed, raw, raw_ferrodist, read_n, start_server, start_server_with};
use ferrodist::tcp::codec::{Limits, Request, VALIDATE_MAGIC};
use ferrodist::tcp::ServerConfig;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn value_reply(v: &str) -> Vec<u8> {
    let mut out = (v.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(v.as_bytes());
    out
}

#[test]
fn a_stock_ping_is_echoed_and_ferrodists_ping_is_answered_with_the_pong() {
    let server = start_server();
    for nonce in [0u32, 0x1356, 0xDEAD_BEEF, u32::MAX] {
        let mut stream = raw(&server, true);
        stream
            .write_all(&frames(&[Request::Ping { nonce }]))
            .unwrap();
        assert_eq!(read_n(&stream, 4), nonce.to_le_bytes(), "nonce {nonce:#x}");
    }
    let stream = raw_ferrodist(&server); // asserts the pong
    drop(stream);
    assert_eq!(server.db().num_keys(), 0, "the handshake stores nothing");
}

#[test]
fn a_stock_clients_request_behind_a_pending_wait_is_answered_at_once() {
    let server = start_server();
    let mut stream = raw(&server, true);
    stream
        .write_all(&frames(&[
            Request::Wait {
                keys: vec![b("/k")],
            },
            Request::Get { key: b("/k") },
            Request::Ping { nonce: 9 },
        ]))
        .unwrap();
    // As torch's libuv server: the GET of a missing key answers an empty value at once.
    assert_eq!(read_n(&stream, 8), 0u64.to_le_bytes());
    assert_eq!(read_n(&stream, 4), 9u32.to_le_bytes());
    let mut setter = raw(&server, true);
    setter
        .write_all(&frames(&[Request::Set {
            key: b("/k"),
            value: b("v"),
        }]))
        .unwrap();
    assert_eq!(read_n(&stream, 1), [0], "STOP_WAITING once the key is set");
}

#[test]
fn a_request_before_validate_closes_the_connection_and_is_not_applied() {
    let server = start_server();
    let mut rogue = raw(&server, false);
    rogue
        .write_all(&frames(&[Request::Set {
            key: b("/k"),
            value: b("v"),
        }]))
        .unwrap();
    assert!(is_closed(&rogue));
    let mut good = raw(&server, true);
    good.write_all(&frames(&[Request::Check {
        keys: vec![b("/k")],
    }]))
    .unwrap();
    assert_eq!(
        read_n(&good, 1),
        [1],
        "NOT_READY: the unvalidated SET was dropped"
    );
}

#[test]
fn pipelined_wait_and_get_are_answered_together_once_the_key_is_set() {
    let server = start_server();
    let mut waiter = raw_ferrodist(&server);
    waiter
        .write_all(&frames(&[
            Request::Wait {
                keys: vec![b("/k")],
            },
            Request::Get { key: b("/k") },
        ]))
        .unwrap();
    waiter
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(
        !is_closed(&waiter),
        "nothing is answered before the key exists"
    );
    waiter
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut setter = raw(&server, true);
    setter
        .write_all(&frames(&[Request::Set {
            key: b("/k"),
            value: b("hello"),
        }]))
        .unwrap();
    let mut expected = vec![0u8];
    expected.extend(value_reply("hello"));
    assert_eq!(read_n(&waiter, expected.len()), expected);
}

#[test]
fn cancel_wait_drops_held_requests_and_leaves_the_connection_usable() {
    let server = start_server();
    let mut stream = raw_ferrodist(&server);
    stream
        .write_all(&frames(&[
            Request::Wait {
                keys: vec![b("/never")],
            },
            Request::Get { key: b("/never") },
            Request::CancelWait,
            Request::Ping { nonce: 7 },
        ]))
        .unwrap();
    assert_eq!(read_n(&stream, 1), [1], "WAIT_CANCELED");
    assert_eq!(
        read_n(&stream, 4),
        7u32.to_le_bytes(),
        "no stray GET reply before the echo"
    );
    assert_eq!(server.db().pending_waits(), 0);
}

#[test]
fn cancel_after_release_reads_stop_then_the_held_reply_then_canceled() {
    let server = start_server();
    let mut stream = raw_ferrodist(&server);
    stream
        .write_all(&frames(&[
            Request::Wait {
                keys: vec![b("/k")],
            },
            Request::Get { key: b("/k") },
        ]))
        .unwrap();
    let mut setter = raw(&server, true);
    setter
        .write_all(&frames(&[Request::Set {
            key: b("/k"),
            value: b("v"),
        }]))
        .unwrap();
    let mut expected = vec![0u8];
    expected.extend(value_reply("v"));
    assert_eq!(read_n(&stream, expected.len()), expected);
    stream.write_all(&frames(&[Request::CancelWait])).unwrap();
    assert_eq!(read_n(&stream, 1), [1], "CANCEL_WAIT is always answered");
}

#[test]
fn an_oversized_declared_value_closes_only_that_connection() {
    let server = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        limits: Limits {
            max_value_bytes: 1024,
            ..Limits::default()
        },
        ..ServerConfig::default()
    });
    let bystander = raw(&server, true);
    let mut hostile = raw(&server, true);
    let mut head = vec![1u8];
    head.extend(2u64.to_le_bytes());
    head.extend(b"/k");
    head.extend(1025u64.to_le_bytes());
    hostile.write_all(&head).unwrap();
    assert!(is_closed(&hostile), "closed before the body was sent");
    (&bystander)
        .write_all(&frames(&[Request::Ping { nonce: 1 }]))
        .unwrap();
    assert_eq!(read_n(&bystander, 4), 1u32.to_le_bytes());
}

#[test]
fn an_unknown_opcode_or_a_second_validate_closes_the_connection() {
    let server = start_server();
    let mut unknown = raw(&server, true);
    unknown.write_all(&[42]).unwrap();
    assert!(is_closed(&unknown));
    let mut twice = raw(&server, true);
    twice
        .write_all(&frames(&[Request::Validate {
            magic: VALIDATE_MAGIC,
        }]))
        .unwrap();
    assert!(is_closed(&twice));
}

#[test]
fn a_request_sent_byte_by_byte_is_served() {
    let server = start_server();
    let mut stream = raw(&server, true);
    let bytes = frames(&[
        Request::Set {
            key: b("/slow"),
            value: b("v"),
        },
        Request::Get { key: b("/slow") },
    ]);
    for byte in bytes {
        stream.write_all(&[byte]).unwrap();
    }
    assert_eq!(read_n(&stream, 9), value_reply("v"));
}

#[test]
fn one_set_wakes_every_waiting_connection() {
    let server = start_server();
    let waiters: Vec<_> = (0..64)
        .map(|_| {
            let mut s = raw(&server, true);
            s.write_all(&frames(&[Request::Wait {
                keys: vec![b("/go")],
            }]))
            .unwrap();
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.db().pending_waits() < waiters.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut setter = raw(&server, true);
    setter
        .write_all(&frames(&[Request::Set {
            key: b("/go"),
            value: b("1"),
        }]))
        .unwrap();
    for w in &waiters {
        assert_eq!(read_n(w, 1), [0]);
    }
}

#[test]
fn shutdown_closes_every_connection() {
    let server = start_server();
    let stream = raw(&server, true);
    ferrodist::runtime::runtime().block_on(server.shutdown(Duration::from_secs(5)));
    assert!(is_closed(&stream));
}

#[test]
fn a_connection_that_never_validates_is_closed_after_its_deadline_and_others_stay() {
    let server = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        validate_within: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let silent = raw(&server, false);
    let mut good = raw(&server, true);
    let started = Instant::now();
    assert!(is_closed(&silent), "the silent connection is still open");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    std::thread::sleep(Duration::from_millis(400));
    good.write_all(&frames(&[Request::Ping { nonce: 5 }]))
        .unwrap();
    assert_eq!(
        read_n(&good, 4),
        5u32.to_le_bytes(),
        "a validated connection stays"
    );
}
