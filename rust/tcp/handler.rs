//! One accepted connection: read requests, apply them to the shared [`Db`], write replies.
//!
//! Requests are handled **in order**, one at a time, as torch's single-threaded servers do, with
//! one improvement: while a WAIT is pending, later requests are read and held back until it is
//! released, instead of being answered at once. So a client may send WAIT and GET in one write
//! and get STOP_WAITING and the value in one round trip (torch's libuv server would answer the
//! GET at once with an empty value). CANCEL_WAIT is the exception: it is acted on as soon as it
//! is read, cancels the pending wait and drops the requests held behind it (they depended on
//! that wait), and is answered with WAIT_CANCELED. A stock client never pipelines, so it sees
//! exactly torch's behaviour.
//!
//! Memory per connection is bounded: the read buffer grows only as far as the frame being read
//! needs, a frame whose declared lengths break [`Limits`] closes the connection at once (before
//! its body is buffered), and the requests held behind a wait are capped in count and bytes.
//! Any protocol breach closes this connection only; the server and other clients carry on.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::task::Poll;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::codec::{
    decode_request, scan_request, FrameError, Limits, Reply, Request, Scan, STOP_WAITING,
    VALIDATE_MAGIC, WAIT_CANCELED,
};
use super::outbox::Outbox;
use super::shutdown::Shutdown;
use super::state::{Db, Waiter};

/// Most requests a client may queue behind one pending WAIT.
const MAX_HELD_REQUESTS: usize = 1024;
/// Largest read; a frame larger than this grows the buffer step by step as its bytes arrive
/// (never by its declared length, which would let a client make the server allocate memory it
/// never sends).
const READ_CHUNK: usize = 16 * 1024;
/// Smallest read buffer; most requests are tens of bytes.
const MIN_READ: usize = 256;
/// Replies are written once this much is queued, even if more requests are buffered.
const FLUSH_AT_BYTES: usize = 64 * 1024;

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum Closed {
    /// The peer closed it or it broke.
    #[error("peer went away: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol or a limit.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// The peer skipped or botched the handshake, or sent a request the server refuses.
    #[error("{0}")]
    Refused(String),
}

/// Per-connection state.
pub struct Handler {
    stream: TcpStream,
    peer: SocketAddr,
    db: Db,
    limits: Limits,
    input: BytesMut,
    output: Outbox,
    validated: bool,
    waiting: Option<Waiter>,
    held: VecDeque<Request>,
    held_bytes: usize,
}

impl Handler {
    /// A handler for an accepted stream.
    pub fn new(stream: TcpStream, peer: SocketAddr, db: Db, limits: Limits) -> Handler {
        Handler {
            stream,
            peer,
            db,
            limits,
            input: BytesMut::new(),
            output: Outbox::default(),
            validated: false,
            waiting: None,
            held: VecDeque::new(),
            held_bytes: 0,
        }
    }

    /// Serves the connection until the peer leaves, breaks the protocol, or shutdown.
    pub async fn run(mut self, mut shutdown: Shutdown) {
        match self.serve(&mut shutdown).await {
            Ok(()) => tracing::debug!(peer = %self.peer, "connection closed"),
            Err(Closed::Io(err)) => tracing::debug!(peer = %self.peer, %err, "connection lost"),
            Err(err) => tracing::warn!(peer = %self.peer, %err, "closing connection"),
        }
    }

    async fn serve(&mut self, shutdown: &mut Shutdown) -> Result<(), Closed> {
        loop {
            self.process_buffered()?;
            if !self.output.is_empty() {
                self.output.write_to(&mut self.stream).await?;
                // More requests may be buffered behind the ones just answered.
                continue;
            }
            if self.input.is_empty() && self.input.capacity() > 0 {
                // Thousands of ranks sit idle or waiting between requests: hold no buffer then.
                self.input = BytesMut::new();
            }
            let need = match scan_request(&self.input, &self.limits)? {
                Scan::Incomplete(need) => need,
                Scan::Complete(_) => self.input.len() + 1,
            };
            let waiting = self.waiting.as_mut();
            tokio::select! {
                ready = self.stream.readable() => {
                    ready?;
                    // The buffer is allocated only once bytes are there to fill it.
                    self.input.reserve(
                        need.saturating_sub(self.input.len()).clamp(MIN_READ, READ_CHUNK),
                    );
                    // One poll of a read, not `try_read_buf`: a short read then clears the
                    // readiness, which saves an EAGAIN read (a syscall) after every request.
                    // Spurious readiness reads nothing and loops.
                    let mut read = std::pin::pin!(self.stream.read_buf(&mut self.input));
                    match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
                        Poll::Ready(Ok(0)) => return Ok(()),
                        Poll::Ready(Ok(_)) | Poll::Pending => {}
                        Poll::Ready(Err(err)) => return Err(err.into()),
                    }
                }
                _ = async { waiting.expect("guarded").released().await }, if waiting.is_some() => {
                    self.waiting = None;
                    self.output.put_u8(STOP_WAITING);
                }
                _ = shutdown.recv() => return Ok(()),
            }
        }
    }

    /// Handles every complete request in the buffer (and those held behind a released wait).
    fn process_buffered(&mut self) -> Result<(), Closed> {
        loop {
            if self.output.len() >= FLUSH_AT_BYTES {
                return Ok(());
            }
            if self.waiting.is_none() {
                if let Some(request) = self.held.pop_front() {
                    self.held_bytes -= request_bytes(&request);
                    self.apply(request)?;
                    continue;
                }
            }
            let Some(request) = decode_request(&mut self.input, &self.limits)? else {
                return Ok(());
            };
            if !self.validated {
                match request {
                    Request::Validate {
                        magic: VALIDATE_MAGIC,
                    } => self.validated = true,
                    other => {
                        return Err(Closed::Refused(format!(
                            "first request must be VALIDATE with the right magic, got {:?}",
                            other.opcode()
                        )))
                    }
                }
                continue;
            }
            match request {
                Request::CancelWait => {
                    self.waiting = None;
                    self.held.clear();
                    self.held_bytes = 0;
                    self.output.put_u8(WAIT_CANCELED);
                }
                request if self.waiting.is_some() => {
                    self.held_bytes += request_bytes(&request);
                    self.held.push_back(request);
                    if self.held.len() > MAX_HELD_REQUESTS
                        || self.held_bytes as u64 > self.limits.max_request_bytes
                    {
                        return Err(Closed::Refused("too many requests behind a wait".into()));
                    }
                }
                request => self.apply(request)?,
            }
        }
    }

    /// Applies one request to the store and queues its reply.
    fn apply(&mut self, request: Request) -> Result<(), Closed> {
        let db = &self.db;
        let reply = match request {
            Request::Validate { .. } => return Err(Closed::Refused("second VALIDATE".into())),
            Request::Set { key, value } => {
                db.set(key, value);
                return Ok(());
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => Reply::Value(db.compare_set(key, expected, desired)),
            Request::Get { key } => Reply::Value(db.get(&key)),
            Request::Add { key, delta } => Reply::Int(
                db.add(key, delta)
                    .map_err(|e| Closed::Refused(e.to_string()))?,
            ),
            Request::Check { keys } => Reply::Byte(if db.check(&keys) {
                super::codec::READY
            } else {
                super::codec::NOT_READY
            }),
            Request::Wait { keys } => match db.wait(&keys) {
                None => Reply::Byte(STOP_WAITING),
                Some(waiter) => {
                    self.waiting = Some(waiter);
                    return Ok(());
                }
            },
            Request::GetNumKeys => Reply::Int(db.num_keys()),
            Request::DeleteKey { key } => Reply::Int(db.delete_key(&key)),
            Request::Append { key, value } => {
                db.append(key, &value);
                return Ok(());
            }
            Request::MultiGet { keys } => Reply::Values(db.multi_get(&keys)),
            Request::MultiSet { pairs } => {
                db.multi_set(pairs);
                return Ok(());
            }
            Request::CancelWait => Reply::Byte(WAIT_CANCELED),
            Request::Ping { nonce } => Reply::Nonce(nonce),
            Request::QueuePush { key, value } => {
                db.queue_push(key, value);
                return Ok(());
            }
            Request::QueuePop { key } => {
                let (len_before, value) = db.queue_pop(&key);
                Reply::Popped { len_before, value }
            }
            Request::QueueLen { key } => Reply::Int(db.queue_len(&key)),
            Request::ListKeys => Reply::Keys(db.list_keys()),
            Request::Barrier { key, world_size } => {
                match db
                    .barrier(key, world_size)
                    .map_err(|e| Closed::Refused(e.to_string()))?
                {
                    None => Reply::Byte(STOP_WAITING),
                    Some(waiter) => {
                        self.waiting = Some(waiter);
                        return Ok(());
                    }
                }
            }
        };
        self.output.reply(reply);
        Ok(())
    }
}

/// Bytes a held request keeps alive (its keys and values).
fn request_bytes(request: &Request) -> usize {
    let mut buf = BytesMut::new();
    request.encode(&mut buf);
    buf.len()
}
