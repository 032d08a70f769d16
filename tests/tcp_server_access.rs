//! Access control of the server over real sockets: the token's challenge and proof, stock
//! clients refused or admitted, and the connection cap.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{eventually, frames, is_closed, raw, read_n, start_server_with};
use ferrodist::error::Error;
use ferrodist::store::Deadline;
use ferrodist::tcp::auth::{AuthToken, ADMITTED, CHALLENGE_LEN, FERRODIST_PONG_AUTH, REFUSED};
use ferrodist::tcp::codec::{Request, FERRODIST_PING};
use ferrodist::tcp::server::metrics::Refusal;
use ferrodist::tcp::{Client, Server, ServerConfig};

const SECRET: &str = "correct horse battery staple";

fn token(text: &str) -> AuthToken {
    AuthToken::new(text).unwrap()
}

fn server_with_token(allow_torch: bool) -> Server {
    start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        auth_token: Some(token(SECRET)),
        allow_unauthenticated_torch_clients: allow_torch,
        ..ServerConfig::default()
    })
}

fn connect(server: &Server, with: Option<&AuthToken>) -> ferrodist::error::Result<Client> {
    let port = server.local_addr().port();
    Client::connect_with_token("127.0.0.1", port, Duration::from_secs(30), with)
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn set_then_get(client: &mut Client, key: &str) -> Bytes {
    let key = Bytes::copy_from_slice(key.as_bytes());
    let set = Request::Set {
        key: key.clone(),
        value: Bytes::from_static(b"v"),
    };
    client.call(deadline(), &set).unwrap();
    client
        .call_value(deadline(), &Request::Get { key })
        .unwrap()
}

#[test]
fn a_client_holding_the_token_is_admitted_and_served() {
    let server = server_with_token(false);
    let mut client = connect(&server, Some(&token(SECRET))).expect("admitted");
    assert!(client.is_ferrodist_server());
    assert_eq!(set_then_get(&mut client, "/k"), Bytes::from_static(b"v"));
    assert_eq!(server.metrics().refused_count(Refusal::Authentication), 0);
}

#[test]
fn a_wrong_token_fails_at_once_with_an_authentication_error_that_hides_both_tokens() {
    let server = server_with_token(false);
    let started = Instant::now();
    let err = connect(&server, Some(&token("not the secret")))
        .err()
        .expect("refused");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused in {:?}: the refusal must not be retried into the timeout",
        started.elapsed()
    );
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("authentication failed"), "{message}");
    assert!(!message.contains(SECRET) && !message.contains("not the secret"));
    eventually("the refusal is counted", || {
        server.metrics().refused_count(Refusal::Authentication) == 1
    });
}

#[test]
fn a_client_without_a_token_is_told_the_store_needs_one() {
    let server = server_with_token(true);
    let err = connect(&server, None).err().expect("refused");
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
    assert!(err.to_string().contains("requires an auth token"), "{err}");
    eventually("the client's departure is counted as a refusal", || {
        server.metrics().refused_count(Refusal::Authentication) == 1
    });
}

#[test]
fn a_client_holding_a_token_still_uses_a_server_without_one() {
    let server = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        ..ServerConfig::default()
    });
    let mut client = connect(&server, Some(&token(SECRET))).expect("connects");
    assert_eq!(set_then_get(&mut client, "/k"), Bytes::from_static(b"v"));
}

/// What a stock torch client sends first: VALIDATE, then PING with its pid.
fn stock_handshake(server: &Server) -> std::net::TcpStream {
    let mut stream = raw(server, true);
    stream
        .write_all(&frames(&[Request::Ping { nonce: 4242 }]))
        .unwrap();
    stream
}

#[test]
fn a_stock_client_is_refused_unless_the_operator_admits_them() {
    let strict = server_with_token(false);
    let mut stream = stock_handshake(&strict);
    assert_eq!(read_n(&stream, 4), 4242u32.to_le_bytes(), "PING echoed");
    stream.write_all(&frames(&[Request::GetNumKeys])).unwrap();
    assert!(is_closed(&stream), "refused at its first request: closed");
    eventually("the torch client is counted", || {
        strict.metrics().refused_count(Refusal::TorchClient) == 1
    });
    let lenient = server_with_token(true);
    let mut stream = stock_handshake(&lenient);
    assert_eq!(read_n(&stream, 4), 4242u32.to_le_bytes(), "PING echoed");
    stream.write_all(&frames(&[Request::GetNumKeys])).unwrap();
    assert_eq!(read_n(&stream, 8), 0i64.to_le_bytes(), "served");
}

/// Sends the marker PING and returns the challenge.
fn challenged(server: &Server) -> (std::net::TcpStream, Vec<u8>) {
    let mut stream = raw(server, true);
    stream
        .write_all(&frames(&[Request::Ping {
            nonce: FERRODIST_PING,
        }]))
        .unwrap();
    assert_eq!(read_n(&stream, 4), FERRODIST_PONG_AUTH.to_le_bytes());
    let challenge = read_n(&stream, CHALLENGE_LEN);
    (stream, challenge)
}

#[test]
fn the_proof_is_an_hmac_of_a_fresh_challenge_and_a_replayed_one_is_refused() {
    let server = server_with_token(false);
    let (mut first, challenge) = challenged(&server);
    let proof = token(SECRET).prove(&challenge);
    first.write_all(&proof).unwrap();
    assert_eq!(read_n(&first, 1), [ADMITTED]);
    first.write_all(&frames(&[Request::GetNumKeys])).unwrap();
    assert_eq!(
        read_n(&first, 8),
        0i64.to_le_bytes(),
        "served after the proof"
    );

    let (mut second, other_challenge) = challenged(&server);
    assert_ne!(
        challenge, other_challenge,
        "every connection gets its own challenge"
    );
    second.write_all(&proof).unwrap(); // the first connection's proof, replayed
    assert_eq!(read_n(&second, 1), [REFUSED]);
    assert!(is_closed(&second));
}

#[test]
fn a_proof_sent_a_byte_at_a_time_is_still_checked_whole() {
    let server = server_with_token(false);
    let (mut stream, challenge) = challenged(&server);
    for byte in token(SECRET).prove(&challenge) {
        stream.write_all(&[byte]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(read_n(&stream, 1), [ADMITTED]);
}

#[test]
fn beyond_max_connections_new_ones_are_closed_and_admitted_ones_carry_on() {
    let server = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        max_connections: Some(3),
        ..ServerConfig::default()
    });
    let mut admitted: Vec<Client> = (0..3).map(|_| connect(&server, None).unwrap()).collect();
    eventually("three open", || server.metrics().open_connections() == 3);
    let extra = raw(&server, true);
    assert!(is_closed(&extra), "the fourth connection is closed");
    assert_eq!(server.metrics().refused_count(Refusal::MaxConnections), 1);
    for (i, client) in admitted.iter_mut().enumerate() {
        assert_eq!(
            set_then_get(client, &format!("/k{i}")),
            Bytes::from_static(b"v")
        );
    }
    drop(admitted.pop());
    eventually("one left", || server.metrics().open_connections() == 2);
    let mut again = connect(&server, None).expect("room again");
    assert_eq!(set_then_get(&mut again, "/again"), Bytes::from_static(b"v"));
}

#[test]
fn a_connection_that_never_proves_the_token_is_closed_at_the_handshake_deadline() {
    let server = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        auth_token: Some(token(SECRET)),
        validate_within: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let (silent_after_challenge, _) = challenged(&server);
    let silent_after_validate = raw(&server, true);
    let started = Instant::now();
    assert!(is_closed(&silent_after_challenge));
    assert!(is_closed(&silent_after_validate));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn an_authenticated_ferrodist_client_keeps_its_one_round_trip_get() {
    let server = server_with_token(false);
    let mut waiting = connect(&server, Some(&token(SECRET))).unwrap();
    let mut setter = connect(&server, Some(&token(SECRET))).unwrap();
    let key = Bytes::from_static(b"/later");
    let getter = std::thread::spawn(move || {
        let get = Request::Get { key: key.clone() };
        waiting
            .wait_then(deadline(), &[key], Some(get), None)
            .unwrap()
            .expect("released")
    });
    std::thread::sleep(Duration::from_millis(50));
    let set = Request::Set {
        key: Bytes::from_static(b"/later"),
        value: Bytes::from_static(b"here"),
    };
    setter.call(deadline(), &set).unwrap();
    let reply = getter.join().unwrap();
    assert_eq!(
        reply,
        Some(ferrodist::tcp::codec::Reply::Value(Bytes::from_static(
            b"here"
        )))
    );
}

#[test]
fn a_stock_client_that_leaves_after_torchs_handshake_is_counted_as_a_torch_client() {
    let strict = server_with_token(false);
    let stream = stock_handshake(&strict);
    assert_eq!(read_n(&stream, 4), 4242u32.to_le_bytes(), "PING echoed");
    drop(stream);
    eventually("the torch client is counted", || {
        strict.metrics().refused_count(Refusal::TorchClient) == 1
    });
    assert_eq!(strict.metrics().refused_count(Refusal::Authentication), 0);
}
