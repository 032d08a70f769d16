//! The metrics endpoint: `GET /metrics` (Prometheus text), `GET /flight` (the flight recorder's
//! live view, a page a person reads) and `GET /healthz`, over HTTP/1.1. This file only routes:
//! the numbers are `metrics.rs`'s, the view is `crate::flight::live`'s.
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
//!   other, and the store's connections never wait on it; a body is made on tokio's blocking
//!   pool, since reading the jobs' summaries parses up to `flight::live::MAX_READ_BYTES`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::shutdown::Shutdown;
use super::Shared;
use crate::flight::{live_text, LiveView};
use crate::store::db::Db;

/// Longest request head read.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Longest a scrape may take, from accept to the last byte written.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Most scrape connections served at once.
pub const MAX_SCRAPERS: usize = 32;

/// Said on `GET /flight` when the server's state is not in its memory.
pub const FLIGHT_NOT_AVAILABLE: &str = "ferrodist flight recorder: live view not available: \
     this server keeps its state in etcd (--backend etcd://), not in its memory, and reads no \
     summaries from there\n";

/// Serves scrapes from `listener` until shutdown. `flight`: whether `db` holds the served
/// state (the in-memory backend), so that the jobs' flight summaries can be read from it.
pub async fn serve(
    listener: TcpListener,
    db: Db,
    shared: Arc<Shared>,
    flight: bool,
    mut shutdown: Shutdown,
) {
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
            let route = Route {
                db,
                shared,
                healthy,
                flight,
            };
            let _ = tokio::time::timeout(DEADLINE, answer(stream, route)).await;
            drop(slot);
        });
    }
}

/// What a request is answered from.
struct Route {
    db: Db,
    shared: Arc<Shared>,
    healthy: bool,
    flight: bool,
}

/// Reads one request head and writes its response.
async fn answer(mut stream: TcpStream, route: Route) {
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
        match tokio::task::spawn_blocking(move || respond(&head, &route)).await {
            Ok(response) => response,
            Err(_) => return,
        }
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
fn respond(head: &[u8], route: &Route) -> (&'static str, &'static str, String) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    const TEXT: &str = "text/plain; charset=utf-8";
    let db = &route.db;
    match (method, path) {
        ("GET", "/metrics") => {
            let mut body = route.shared.metrics.render_prometheus(db);
            if route.flight {
                body.push_str(&live_text::render_prometheus(&LiveView::of_db(db)));
            }
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        ("GET", "/flight") if route.flight => {
            ("200 OK", TEXT, live_text::render_page(&LiveView::of_db(db)))
        }
        ("GET", "/flight") => ("200 OK", TEXT, FLIGHT_NOT_AVAILABLE.into()),
        ("GET", "/healthz") if route.healthy => ("200 OK", TEXT, "ok\n".into()),
        ("GET", "/healthz") => ("503 Service Unavailable", TEXT, "shutting down\n".into()),
        ("GET", _) => (
            "404 Not Found",
            TEXT,
            "try /metrics, /flight or /healthz\n".into(),
        ),
        _ => ("405 Method Not Allowed", TEXT, "only GET\n".into()),
    }
}
