//! Access control over real sockets: the token proven both ways (the client's proof, the
//! server's in turn, neither replayable on another connection), a client with a token that
//! sends nothing to a server that proves nothing (impostors, servers without a token, torch's),
//! stock clients refused or admitted, and the connection cap.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{eventually, frames, is_closed, raw, read_n, start_server_with};
use ferrodist::error::Error;
use ferrodist::store::Deadline;
use ferrodist::tcp::auth::{
    self, AuthToken, Challenges, Side, ADMITTED, CHALLENGE_LEN, CLIENT_ANSWER_LEN,
    FERRODIST_PONG_AUTH, FERRODIST_PONG_AUTH_V1, PROOF_LEN, REFUSED,
};
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

/// The client's answer to `server_challenge` with `client_challenge`: its proof, then its
/// challenge.
fn answer(server_challenge: &[u8], client_challenge: &[u8]) -> Vec<u8> {
    let challenges = Challenges {
        server: server_challenge,
        client: client_challenge,
    };
    let mut answer = token(SECRET).prove(Side::Client, challenges).to_vec();
    answer.extend_from_slice(client_challenge);
    answer
}

#[test]
fn the_proofs_are_hmacs_of_both_fresh_challenges_and_a_replayed_one_is_refused() {
    let server = server_with_token(false);
    let (mut first, challenge) = challenged(&server);
    let ours = auth::challenge().unwrap();
    first.write_all(&answer(&challenge, &ours)).unwrap();
    assert_eq!(read_n(&first, 1), [ADMITTED]);
    let both = Challenges {
        server: &challenge,
        client: &ours,
    };
    assert_eq!(
        read_n(&first, PROOF_LEN),
        token(SECRET).prove(Side::Server, both),
        "the server proves the token in turn"
    );
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
    // The first connection's answer, replayed.
    second.write_all(&answer(&challenge, &ours)).unwrap();
    assert_eq!(read_n(&second, 1), [REFUSED]);
    assert!(is_closed(&second));
}

#[test]
fn an_answer_sent_a_byte_at_a_time_is_still_checked_whole() {
    let server = server_with_token(false);
    let (mut stream, challenge) = challenged(&server);
    for byte in answer(&challenge, &auth::challenge().unwrap()) {
        stream.write_all(&[byte]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(read_n(&stream, 1), [ADMITTED]);
}

/// A one-connection impostor on a port of its own: it answers torch's handshake, then the
/// marker with `pong` and does `then` with the client's stream; returns what the client sent
/// after the handshake.
fn impostor(
    pong: u32,
    then: impl FnOnce(&mut TcpStream) + Send + 'static,
) -> (u16, thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut handshake = [0u8; 15]; // VALIDATE, PING(pid), PING(marker)
        conn.read_exact(&mut handshake).unwrap();
        conn.write_all(&handshake[6..10]).unwrap();
        conn.write_all(&pong.to_le_bytes()).unwrap();
        then(&mut conn);
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        rest
    });
    (port, handle)
}

fn connect_to(port: u16, with: &AuthToken) -> ferrodist::error::Result<Client> {
    Client::connect_with_token("127.0.0.1", port, Duration::from_secs(10), Some(with))
}

#[test]
fn a_client_with_a_token_sends_nothing_to_a_server_that_proves_nothing() {
    // A ferrodist server without a token, and a server that echoes the marker (torch's).
    let plain = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        ..ServerConfig::default()
    });
    let err = connect(&plain, Some(&token(SECRET)))
        .err()
        .expect("refused");
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
    assert!(err.to_string().contains("requires no token"), "{err}");
    for pong in [FERRODIST_PING, FERRODIST_PONG_AUTH_V1] {
        let (port, peer) = impostor(pong, |_| {});
        let started = Instant::now();
        let err = connect_to(port, &token(SECRET)).err().expect("refused");
        assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "not retried");
        assert_eq!(
            peer.join().unwrap(),
            b"",
            "nothing sent after the handshake"
        );
    }
}

#[test]
fn a_server_proof_replayed_from_another_connection_is_refused() {
    // A man in the middle records a real server's challenge and proof on one connection...
    let server = server_with_token(false);
    let (mut recorded, challenge) = challenged(&server);
    recorded
        .write_all(&answer(&challenge, &auth::challenge().unwrap()))
        .unwrap();
    assert_eq!(read_n(&recorded, 1), [ADMITTED]);
    let proof = read_n(&recorded, PROOF_LEN);
    // ...and replays both to a client on another one.
    let (port, peer) = impostor(FERRODIST_PONG_AUTH, move |conn| {
        conn.write_all(&challenge).unwrap();
        let mut client_answer = [0u8; CLIENT_ANSWER_LEN];
        conn.read_exact(&mut client_answer).unwrap();
        conn.write_all(&[ADMITTED]).unwrap();
        conn.write_all(&proof).unwrap();
    });
    let err = connect_to(port, &token(SECRET)).err().expect("refused");
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
    assert!(err.to_string().contains("could not prove"), "{err}");
    assert!(!err.to_string().contains(SECRET));
    assert_eq!(peer.join().unwrap(), b"", "nothing sent after the answer");
}

#[test]
fn a_server_that_admits_anyone_without_proving_the_token_is_refused() {
    let (port, peer) = impostor(FERRODIST_PONG_AUTH, |conn| {
        conn.write_all(&auth::challenge().unwrap()).unwrap();
        let mut client_answer = [0u8; CLIENT_ANSWER_LEN];
        conn.read_exact(&mut client_answer).unwrap();
        conn.write_all(&[ADMITTED]).unwrap();
        conn.write_all(&auth::challenge().unwrap()).unwrap(); // 32 bytes that prove nothing
    });
    let err = connect_to(port, &token(SECRET)).err().expect("refused");
    assert!(matches!(err, Error::Unauthenticated(_)), "{err:?}");
    assert_eq!(peer.join().unwrap(), b"");
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

fn server_admitting_torch_clients_from(networks: &[&str]) -> Server {
    start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        auth_token: Some(token(SECRET)),
        allow_unauthenticated_torch_clients: true,
        torch_clients_from: networks.iter().map(|n| n.parse().unwrap()).collect(),
        ..ServerConfig::default()
    })
}

#[test]
fn stock_clients_are_served_without_a_token_only_from_the_networks_admitted() {
    // Loopback by default (the lenient server above), or exactly the networks named.
    let elsewhere = server_admitting_torch_clients_from(&["10.99.0.0/16", "fd00:99::/32"]);
    let mut stream = stock_handshake(&elsewhere);
    assert_eq!(read_n(&stream, 4), 4242u32.to_le_bytes(), "PING echoed");
    stream.write_all(&frames(&[Request::GetNumKeys])).unwrap();
    assert!(is_closed(&stream), "127.0.0.1 is not on 10.99.0.0/16");
    eventually("the torch client is counted", || {
        elsewhere.metrics().refused_count(Refusal::TorchClient) == 1
    });

    let here = server_admitting_torch_clients_from(&["127.0.0.1/32"]);
    let mut stream = stock_handshake(&here);
    assert_eq!(read_n(&stream, 4), 4242u32.to_le_bytes(), "PING echoed");
    stream.write_all(&frames(&[Request::GetNumKeys])).unwrap();
    assert_eq!(read_n(&stream, 8), 0i64.to_le_bytes(), "served");
}

#[test]
fn garbage_or_oversize_answers_are_refused_and_a_silent_client_is_closed_at_the_deadline() {
    let server = start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        auth_token: Some(token(SECRET)),
        validate_within: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    // 200 bytes of junk where the 64-byte answer belongs: refused on its first 64, then closed.
    let (mut junk, _) = challenged(&server);
    junk.write_all(&[0xAB; 200]).unwrap();
    assert_eq!(read_n(&junk, 1), [REFUSED]);
    assert!(is_closed(&junk));
    // Half an answer, then nothing: closed by the handshake deadline, never admitted.
    let (mut silent, challenge) = challenged(&server);
    silent
        .write_all(&answer(&challenge, &auth::challenge().unwrap())[..40])
        .unwrap();
    let started = Instant::now();
    assert!(is_closed(&silent));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    eventually("both connections closed on the server", || {
        server.metrics().open_connections() == 0
    });
}
