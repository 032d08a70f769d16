//! Helpers shared by the integration tests: a server on a free loopback port, raw sockets,
//! etcd clusters, this checkout's release `ferrodist-store` (`release_build`).

#![allow(dead_code)]

pub mod etcd;
pub mod release_build;
pub mod store_binary;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferrodist::tcp::codec::{Request, FERRODIST_PING, FERRODIST_PONG, VALIDATE_MAGIC};
use ferrodist::tcp::{Server, ServerConfig};

/// A server on 127.0.0.1 with a port the OS picked.
pub fn start_server() -> Server {
    start_server_with(ServerConfig {
        host: "127.0.0.1".into(),
        ..ServerConfig::default()
    })
}

/// A server with `config` (host and port as given).
pub fn start_server_with(config: ServerConfig) -> Server {
    Server::start(&config).expect("server starts")
}

/// Encodes requests back to back.
pub fn frames(requests: &[Request]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    for r in requests {
        r.encode(&mut buf);
    }
    buf.to_vec()
}

/// A raw blocking socket to `server`, already past the handshake unless `validate` is false.
pub fn raw(server: &Server, validate: bool) -> TcpStream {
    raw_to(server.local_addr(), validate)
}

/// A raw blocking socket to the server at `addr`, as [`raw`].
pub fn raw_to(addr: std::net::SocketAddr, validate: bool) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    if validate {
        (&stream)
            .write_all(&frames(&[Request::Validate {
                magic: VALIDATE_MAGIC,
            }]))
            .unwrap();
    }
    stream
}

/// A raw socket past the handshake that ferrodist's client does (its PING marks the connection
/// as a ferrodist client, whose requests behind a pending WAIT are held until it is released).
pub fn raw_ferrodist(server: &Server) -> TcpStream {
    let mut stream = raw(server, true);
    stream
        .write_all(&frames(&[Request::Ping {
            nonce: FERRODIST_PING,
        }]))
        .unwrap();
    assert_eq!(read_n(&stream, 4), FERRODIST_PONG.to_le_bytes());
    stream
}

/// Reads exactly `n` bytes.
pub fn read_n(mut stream: &TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    stream.read_exact(&mut buf).expect("reply arrives");
    buf
}

/// True when the server closed the connection (EOF or reset) within the read timeout.
pub fn is_closed(mut stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Waits until `cond` holds, for at most 10 s (a server counts a connection's end, a refusal,
/// once that connection's task has finished).
pub fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
