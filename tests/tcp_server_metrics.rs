//! The server's metrics over real sockets: the numbers move with real traffic, and the HTTP
//! endpoint answers scrapes and health checks, bounded against slow and oversized clients.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{eventually, frames, is_closed, raw, raw_ferrodist, read_n, start_server_with};
use ferrodist::tcp::codec::Request;
use ferrodist::tcp::{Server, ServerConfig};

fn server() -> Server {
    start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        metrics_addr: Some("127.0.0.1:0".into()),
        ..ServerConfig::default()
    })
}

/// One HTTP exchange: status line and body.
fn http(addr: SocketAddr, request: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

fn scrape(server: &Server) -> String {
    let addr = server.metrics_addr().expect("metrics served");
    let (status, body) = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    body
}

/// The value of the sample `name` (with its labels, as written) in `text`.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
}

#[test]
fn the_numbers_move_with_real_traffic() {
    let server = server();
    let before = scrape(&server);
    assert_eq!(sample(&before, "ferrodist_store_keys"), 0.0);
    assert_eq!(sample(&before, "ferrodist_store_open_connections"), 0.0);

    let mut client = raw_ferrodist(&server);
    client
        .write_all(&frames(&[
            Request::Set {
                key: Bytes::from_static(b"/a"),
                value: Bytes::from_static(b"12345"),
            },
            Request::Set {
                key: Bytes::from_static(b"/b"),
                value: Bytes::from_static(b"x"),
            },
            Request::Get {
                key: Bytes::from_static(b"/a"),
            },
        ]))
        .unwrap();
    read_n(&client, 8 + 5);
    let mut waiter = raw_ferrodist(&server);
    waiter
        .write_all(&frames(&[Request::Wait {
            keys: vec![Bytes::from_static(b"/never")],
        }]))
        .unwrap();
    eventually("the wait is pending", || server.db().pending_waits() == 1);
    let mut breaker = raw(&server, true);
    breaker.write_all(&[0xEE]).unwrap(); // no such opcode
    assert!(is_closed(&breaker));
    eventually("the frame is counted", || {
        server.metrics().rejected_frames() == 1
    });

    let text = scrape(&server);
    assert_eq!(sample(&text, "ferrodist_store_keys"), 2.0);
    assert_eq!(sample(&text, "ferrodist_store_stored_bytes"), 10.0);
    assert_eq!(sample(&text, "ferrodist_store_pending_waits"), 1.0);
    assert_eq!(sample(&text, "ferrodist_store_open_connections"), 2.0);
    assert_eq!(
        sample(&text, "ferrodist_store_connections_accepted_total"),
        3.0
    );
    assert_eq!(sample(&text, "ferrodist_store_rejected_frames_total"), 1.0);
    assert_eq!(
        sample(&text, "ferrodist_store_requests_total{opcode=\"set\"}"),
        2.0
    );
    assert_eq!(
        sample(&text, "ferrodist_store_requests_total{opcode=\"get\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "ferrodist_store_requests_total{opcode=\"wait\"}"),
        1.0
    );
    assert_eq!(
        sample(&text, "ferrodist_store_requests_total{opcode=\"ping\"}"),
        2.0
    );
    let count = sample(&text, "ferrodist_store_request_duration_seconds_count");
    let inf = sample(
        &text,
        "ferrodist_store_request_duration_seconds_bucket{le=\"+Inf\"}",
    );
    assert_eq!(count, 6.0, "2 PINGs, 2 SETs, a GET and a WAIT");
    assert_eq!(inf, count);
    assert!(sample(&text, "ferrodist_store_request_duration_seconds_sum") > 0.0);
    let in_process = server.render_metrics();
    assert!(
        in_process.contains("ferrodist_store_keys 2"),
        "{in_process}"
    );
    drop((client, waiter));
}

#[test]
fn health_answers_and_unknown_requests_get_http_errors() {
    let server = server();
    let addr = server.metrics_addr().unwrap();
    assert_eq!(
        http(addr, "GET /healthz HTTP/1.1\r\n\r\n"),
        ("HTTP/1.1 200 OK".into(), "ok\n".into())
    );
    assert_eq!(
        http(addr, "GET /nope HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        http(addr, "POST /metrics HTTP/1.1\r\n\r\n").0,
        "HTTP/1.1 405 Method Not Allowed"
    );
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert_eq!(
        http(addr, &huge).0,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
}

#[test]
fn a_silent_scraper_holds_up_no_other_scrape() {
    let server = server();
    let addr = server.metrics_addr().unwrap();
    let _silent: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let started = Instant::now();
    let text = scrape(&server);
    assert!(text.contains("ferrodist_store_keys 0"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_metrics_address_that_cannot_be_bound_stops_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ServerConfig {
        host: "127.0.0.1".into(),
        metrics_addr: Some(taken.local_addr().unwrap().to_string()),
        ..ServerConfig::default()
    };
    let err = Server::start(&config).err().expect("refused");
    assert!(err.to_string().contains("cannot serve metrics"), "{err}");
}
