//! The metrics endpoint: `GET /metrics` (Prometheus text) and `GET /healthz`, over HTTP/1.1.
//!
//! Written on tokio directly rather than with hyper: it answers two fixed paths to a scraper
//! every few seconds, one response per connection (`Connection: close`), which takes ~100
//! lines; hyper with `hyper-util` would add a dozen crates to a binary that starts in
//! milliseconds. What makes it safe to expose next to the store:
//!
//! * a request head is read up to [`MAX_HEAD_BYTES`] (longer is answered 431) and the whole
//!   exchange has [`DEADLINE`]: a slow or silent client is dropped, it cannot pin a task;
//! * at most [`MAX_SCRAPERS`] connections at once (more are closed at accept), so it cannot
//!   spend the process's descriptors, which the store's clients need;
//! * each connection is its own task on the shared runtime, so one stuck client delays no
//!   other, and the store's connections never wait on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::shutdown::Shutdown;
use super::Shared;
use crate::store::db::Db;

/// Longest request head read.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Longest a scrape may take, from accept to the last byte written.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Most scrape connections served at once.
pub const MAX_SCRAPERS: usize = 32;

/// Serves scrapes from `listener` until shutdown.
pub async fn serve(listener: TcpListener, db: Db, shared: Arc<Shared>, mut shutdown: Shutdown) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPERS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.recv() => return,
        };
        let Ok((stream, _peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            continue; // too many scrapers: this one is closed unanswered
        };
        let (db, shared) = (db.clone(), Arc::clone(&shared));
        let healthy = !shutdown.is_shutdown();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DEADLINE, answer(stream, &db, &shared, healthy)).await;
            drop(slot);
        });
    }
}

/// Reads one request head and writes its response.
async fn answer(mut stream: TcpStream, db: &Db, shared: &Shared, healthy: bool) {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if head.len() > MAX_HEAD_BYTES {
            break false;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    };
    let (status, content_type, body) = if complete {
        respond(&head, db, shared, healthy)
    } else {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request head too large\n".to_owned(),
        )
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Status, content type and body for a complete request head.
fn respond(
    head: &[u8],
    db: &Db,
    shared: &Shared,
    healthy: bool,
) -> (&'static str, &'static str, String) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    const TEXT: &str = "text/plain; charset=utf-8";
    match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            shared.metrics.render_prometheus(db),
        ),
        ("GET", "/healthz") if healthy => ("200 OK", TEXT, "ok\n".into()),
        ("GET", "/healthz") => ("503 Service Unavailable", TEXT, "shutting down\n".into()),
        ("GET", _) => ("404 Not Found", TEXT, "try /metrics or /healthz\n".into()),
        _ => ("405 Method Not Allowed", TEXT, "only GET\n".into()),
    }
}
