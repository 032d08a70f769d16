//! One accepted connection: read requests, serve them from the server's storage [`Engine`]
//! (the in-memory [`Db`], or etcd) through the one dispatcher (`dispatch.rs`), write replies.
//!
//! Requests are handled **in order**, one at a time, as torch's servers do. What happens to a
//! request that arrives while a WAIT is still pending depends on who sent it:
//!
//! * A **stock client** gets torch's behaviour: the request is answered at once (a GET of a
//!   missing key answers an empty value, as torch's libuv server does), and the STOP_WAITING
//!   comes whenever the wait is released. Only a second WAIT or BARRIER is held until the first
//!   is released, since a connection has one pending wait.
//! * A **ferrodist client** (it sent [`FERRODIST_PING`] in its handshake) gets every later
//!   request held until the wait is released. So it may send WAIT and GET in one write and get
//!   STOP_WAITING and the value in one round trip.
//!
//! CANCEL_WAIT is acted on as soon as it is read, cancels the pending wait, drops the requests
//! held behind it (they depended on that wait) and is answered with WAIT_CANCELED.
//!
//! Memory per connection is bounded: the read buffer grows only as far as the frame being read
//! needs, a frame whose declared lengths break [`Limits`](crate::tcp::codec::Limits) closes the
//! connection at once (before its body is buffered), and the requests held behind a wait are
//! capped in count and bytes. Any protocol breach closes this connection only; the server and
//! other clients carry on.
//!
//! The handshake (VALIDATE, and the token's proof on a server with one) is in
//! `handler/admission.rs`; every request served is counted in the server's
//! [`metrics`](super::metrics), with the time it took.
//!
//! An engine may answer a request later ([`Served::Later`], etcd): the connection then polls
//! that request's future beside its socket and its pending wait, decodes nothing more until it
//! is answered (requests stay in order), and stops reading once a whole request is buffered
//! behind it (the client's writes wait in TCP, not in the server's memory).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

use self::admission::{Stage, Step};
use super::dispatch::{self, Finished, Outcome, Served};
use super::handshake_deadline::{self, Slot};
use super::log_budget::LogBudget;
use super::metrics::Refusal;
use super::outbox::Outbox;
use super::shutdown::Shutdown;
use super::work_slice::Turn;
use super::Shared;
use crate::store::db::Db;
use crate::store::engine::Engine;
use crate::tcp::auth::CLIENT_ANSWER_LEN;
use crate::tcp::codec::{
    decode_request_from, scan_request_from, FrameError, Reply, Request, Scan, ScanMark,
    FERRODIST_PING, FERRODIST_PONG, FERRODIST_PONG_DURABLE, STOP_WAITING, WAIT_CANCELED,
};

mod admission;

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

/// `Handler::handshake` when the connection has no handshake deadline (any more).
const UNWATCHED: Slot = Slot::MAX;

/// Protocol breaches are logged at most this often (a client may commit them at any rate).
static CLOSING_LOG: LogBudget = LogBudget::new(10);
/// Refused authentications are logged at most this often.
static AUTH_LOG: LogBudget = LogBudget::new(10);

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
    /// The peer did not prove it holds the server's token (see [`crate::tcp::auth`]).
    #[error("{1}")]
    Unauthenticated(Refusal, &'static str),
    /// The backend could not serve a request (etcd without quorum past the store's timeout).
    #[error("the store backend failed: {0}")]
    Backend(String),
}

/// What woke a connection up.
enum Event<W> {
    /// This many bytes were read (0: the peer closed its side).
    Read(usize),
    /// The pending wait was released.
    Released,
    /// The request in flight was answered.
    Answered(Finished<W>),
}

/// Per-connection state.
///
/// Kept small on purpose: a storm of ranks keeps tens of thousands of these alive, one per
/// task. No buffer is held while the connection is idle, the peer address is looked up only to
/// log, and the event loop below polls the socket, the pending wait and the shutdown signal by
/// hand (`poll_serve`) rather than through `select!`, whose three futures tripled the size of
/// every connection's task.
pub struct Handler<E: Engine = Db> {
    stream: TcpStream,
    engine: E,
    /// The server's limits, access rules and metrics.
    shared: Arc<Shared>,
    input: BytesMut,
    /// How far the incomplete multi-key frame at the start of `input` has been scanned.
    scan_mark: ScanMark,
    output: Outbox,
    /// Until the handshake is over: the handshake-deadline slot (or [`UNWATCHED`]).
    handshake: Slot,
    /// How far the handshake has come.
    stage: Stage,
    /// The peer is ferrodist's client: hold every request behind a pending wait.
    holds_behind_wait: bool,
    /// The peer left while a request was in flight: finish serving, reply to no one.
    peer_left: bool,
    /// The challenge sent to a client that must prove it holds the token, until it answers.
    challenge: Option<Box<[u8; crate::tcp::auth::CHALLENGE_LEN]>>,
    waiting: Option<E::Waiter>,
    /// The request the engine is still serving (never one for the in-memory engine, whose
    /// operations in flight are uninhabited: this field takes no space there).
    in_flight: Option<E::Later<Finished<E::Waiter>>>,
    held: VecDeque<Request>,
    held_bytes: usize,
}

impl<E: Engine> Handler<E> {
    /// A handler for an accepted stream, counted as an open connection until it is dropped.
    pub fn new(stream: TcpStream, engine: E, shared: Arc<Shared>) -> Handler<E> {
        shared.metrics.connection_opened();
        Handler {
            stream,
            engine,
            shared,
            input: BytesMut::new(),
            scan_mark: ScanMark::default(),
            output: Outbox::default(),
            handshake: UNWATCHED,
            stage: Stage::Connected,
            holds_behind_wait: false,
            peer_left: false,
            challenge: None,
            waiting: None,
            in_flight: None,
            held: VecDeque::new(),
            held_bytes: 0,
        }
    }

    /// Closes the connection if VALIDATE has not come `within` (see [`handshake_deadline`]).
    /// Call on the runtime.
    pub fn with_handshake_deadline(mut self, within: Duration) -> Handler<E> {
        if let Some(slot) = handshake_deadline::watch(&self.stream, within) {
            self.handshake = slot;
        }
        self
    }

    /// Serves the connection until the peer leaves, breaks the protocol, or shutdown.
    ///
    /// A plain future over the handler, not an `async fn`: an `async fn` keeps a second copy of
    /// its arguments in its state, which doubled the memory of every connection's task.
    pub fn run(mut self, mut shutdown: Shutdown) -> impl Future<Output = ()> + Send {
        poll_fn(move |cx| {
            let outcome = ready!(self.poll_serve(cx, &mut shutdown));
            self.log_end(outcome);
            Poll::Ready(())
        })
    }

    fn log_end(&self, outcome: Result<(), Closed>) {
        match &outcome {
            Err(Closed::Frame(_) | Closed::Refused(_)) => self.shared.metrics.frame_rejected(),
            Err(Closed::Backend(_)) => {}
            Err(Closed::Unauthenticated(why, _)) => self.shared.metrics.refused(*why),
            _ => {}
        }
        let quiet = matches!(outcome, Ok(()) | Err(Closed::Io(_)));
        if quiet && !tracing::enabled!(tracing::Level::DEBUG) {
            return; // spares a getpeername per connection when nobody reads the line
        }
        let peer = self.stream.peer_addr().ok();
        let peer = peer
            .as_ref()
            .map_or(&"(gone)" as &dyn std::fmt::Display, |p| p);
        match outcome {
            Ok(()) => tracing::debug!(%peer, "connection closed"),
            Err(Closed::Io(err)) => tracing::debug!(%peer, %err, "connection lost"),
            Err(err @ Closed::Unauthenticated(..)) => {
                if let Some(suppressed) = AUTH_LOG.admit() {
                    tracing::warn!(%peer, %err, suppressed, "refused connection");
                }
            }
            Err(err) => {
                if let Some(suppressed) = CLOSING_LOG.admit() {
                    tracing::warn!(%peer, %err, suppressed, "closing connection");
                }
            }
        }
    }

    /// The connection's event loop, one poll at a time.
    fn poll_serve(
        &mut self,
        cx: &mut Context<'_>,
        shutdown: &mut Shutdown,
    ) -> Poll<Result<(), Closed>> {
        let turn = Turn::start();
        loop {
            ready!(turn.poll_continue(cx));
            if shutdown.poll_recv(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            if self.peer_left {
                return self.poll_finish(cx);
            }
            if self.stage == Stage::Refused && self.output.is_empty() {
                // The refusal byte is out: now the client can tell why it is being closed.
                return Poll::Ready(Err(admission::WRONG_TOKEN));
            }
            self.process_buffered()?;
            if !self.output.is_empty() {
                ready!(self.output.poll_write_to(&mut self.stream, cx, &turn))?;
                // More requests may be buffered behind the ones just answered.
                continue;
            }
            if self.input.is_empty() && self.input.capacity() > 0 {
                // Thousands of ranks sit idle or waiting between requests: hold no buffer then.
                self.input = BytesMut::new();
            }
            let need = if self.stage == Stage::Challenged {
                Some(CLIENT_ANSWER_LEN) // raw bytes, not a request
            } else {
                match scan_request_from(&self.input, &self.shared.limits, &mut self.scan_mark)? {
                    Scan::Incomplete(need) => Some(need),
                    // Behind a request in flight, a whole request buffered is enough.
                    Scan::Complete(_) if self.in_flight.is_some() => None,
                    Scan::Complete(_) => Some(self.input.len() + 1),
                }
            };
            let event = match ready!(self.poll_event(cx, need)) {
                // The peer went away with a request in flight (a stock client may SET and exit
                // at once): that request and those buffered behind it are still served.
                Ok(Event::Read(0)) | Err(Closed::Io(_)) if self.in_flight.is_some() => {
                    self.peer_left = true;
                    continue;
                }
                event => event?,
            };
            match event {
                Event::Read(0) => return Poll::Ready(self.left_during_handshake()),
                Event::Read(_) => {}
                Event::Released => {
                    self.waiting = None;
                    self.output.put_u8(STOP_WAITING);
                }
                Event::Answered(finished) => {
                    self.in_flight = None;
                    let took = finished.since.elapsed();
                    self.shared.metrics.request_served(finished.opcode, took);
                    self.take_outcome(finished.answer?);
                }
            }
        }
    }

    /// After the peer left: serves the request in flight and every complete request buffered
    /// behind it, as the in-memory engine did on reading them, replying to no one (a wait is
    /// dropped: nobody is there to release), then ends the connection.
    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        loop {
            self.waiting = None;
            self.held.clear();
            self.held_bytes = 0;
            self.output = Outbox::default();
            if let Some(in_flight) = self.in_flight.as_mut() {
                let finished = ready!(Pin::new(in_flight).poll(cx)).map_err(dispatch::closed)?;
                self.in_flight = None;
                let took = finished.since.elapsed();
                self.shared.metrics.request_served(finished.opcode, took);
                finished.answer?;
                continue;
            }
            match self.decode()? {
                Some(request) => self.apply(request, &mut Instant::now())?,
                None => return Poll::Ready(Ok(())),
            }
        }
    }

    /// The next thing to act on: the answer to the request in flight, the pending wait's
    /// release, or bytes from the peer (appended to the input buffer, which wants `need` bytes
    /// in all; `None`: read nothing now).
    fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        need: Option<usize>,
    ) -> Poll<Result<Event<E::Waiter>, Closed>> {
        if let Some(in_flight) = self.in_flight.as_mut() {
            if let Poll::Ready(finished) = Pin::new(in_flight).poll(cx) {
                return Poll::Ready(finished.map(Event::Answered).map_err(dispatch::closed));
            }
        }
        if let Some(waiter) = self.waiting.as_mut() {
            if let Poll::Ready(released) = E::poll_released(waiter, cx) {
                released.map_err(dispatch::closed)?;
                return Poll::Ready(Ok(Event::Released));
            }
        }
        let Some(need) = need else {
            return Poll::Pending;
        };
        // The buffer is allocated only once bytes are there to fill it.
        ready!(self.stream.poll_read_ready(cx))?;
        self.input.reserve(
            need.saturating_sub(self.input.len())
                .clamp(MIN_READ, READ_CHUNK),
        );
        let mut unfilled = ReadBuf::uninit(self.input.spare_capacity_mut());
        // tokio's `poll_read` clears the readiness after a short read, which saves an EAGAIN
        // read (a syscall) after every request; spurious readiness re-registers and pends.
        ready!(Pin::new(&mut self.stream).poll_read(cx, &mut unfilled))?;
        let read = unfilled.filled().len();
        // SAFETY: `poll_read` initialised `read` bytes at the start of the spare capacity.
        unsafe { self.input.set_len(self.input.len() + read) };
        Poll::Ready(Ok(Event::Read(read)))
    }

    /// The next complete request off the input buffer, if there is one.
    fn decode(&mut self) -> Result<Option<Request>, FrameError> {
        decode_request_from(&mut self.input, &self.shared.limits, &mut self.scan_mark)
    }

    /// Handles every complete request in the buffer (and those held behind a released wait).
    fn process_buffered(&mut self) -> Result<(), Closed> {
        // One clock read per request: each request's time runs from the end of the previous
        // one (or the start of the batch), so it covers decoding it too.
        let mut mark = Instant::now();
        loop {
            if self.output.len() >= FLUSH_AT_BYTES || self.in_flight.is_some() {
                return Ok(());
            }
            if self.waiting.is_none() {
                if let Some(request) = self.held.pop_front() {
                    self.held_bytes -= request_bytes(&request);
                    self.apply(request, &mut mark)?;
                    continue;
                }
            }
            let request = match self.stage {
                Stage::Admitted => match self.decode()? {
                    Some(request) => request,
                    None => return Ok(()),
                },
                _ => match self.handshake_step()? {
                    Step::Serve(request) => request,
                    Step::Next => continue,
                    Step::Stop => return Ok(()),
                },
            };
            match request {
                Request::CancelWait => {
                    self.waiting = None;
                    self.held.clear();
                    self.held_bytes = 0;
                    self.output.put_u8(WAIT_CANCELED);
                }
                request if self.waiting.is_some() && self.must_hold(&request) => {
                    self.held_bytes += request_bytes(&request);
                    self.held.push_back(request);
                    if self.held.len() > MAX_HELD_REQUESTS
                        || self.held_bytes as u64 > self.shared.limits.max_request_bytes
                    {
                        return Err(Closed::Refused("too many requests behind a wait".into()));
                    }
                }
                request => self.apply(request, &mut mark)?,
            }
        }
    }

    /// Whether `request`, read while a wait is pending, waits for its release.
    fn must_hold(&self, request: &Request) -> bool {
        self.holds_behind_wait
            || !self.held.is_empty()
            || matches!(request, Request::Wait { .. } | Request::Barrier { .. })
    }

    /// Applies one request to the store and queues its reply, counting it in the metrics as
    /// taking the time since `mark` (which moves to now). A request the engine answers later
    /// is counted when it is answered.
    fn apply(&mut self, request: Request, mark: &mut Instant) -> Result<(), Closed> {
        let opcode = request.opcode();
        let applied = self.apply_uncounted(request);
        if self.in_flight.is_some() {
            return applied;
        }
        let now = Instant::now();
        let took = now.saturating_duration_since(*mark);
        *mark = now;
        self.shared.metrics.request_served(opcode, took);
        applied
    }

    /// Acts on a request's outcome: queues the reply, or keeps the wait.
    fn take_outcome(&mut self, outcome: Outcome<E::Waiter>) {
        match outcome {
            Outcome::Reply(reply) => self.output.reply(reply),
            Outcome::Silent => {}
            Outcome::Waiting(waiter) => self.waiting = Some(waiter),
            Outcome::Stream(source) => self.output.stream(source),
        }
    }

    fn apply_uncounted(&mut self, request: Request) -> Result<(), Closed> {
        let reply = match request {
            Request::Validate { .. } => return Err(Closed::Refused("second VALIDATE".into())),
            Request::CancelWait => Reply::Byte(WAIT_CANCELED),
            Request::Ping {
                nonce: FERRODIST_PING,
            } => {
                self.holds_behind_wait = true;
                Reply::Nonce(if E::DURABLE {
                    FERRODIST_PONG_DURABLE
                } else {
                    FERRODIST_PONG
                })
            }
            Request::Ping { nonce } => Reply::Nonce(nonce),
            request => {
                match dispatch::serve(&self.engine, request) {
                    Served::Now(answer) => self.take_outcome(answer?),
                    Served::Later(pending) => self.in_flight = Some(pending),
                }
                return Ok(());
            }
        };
        self.output.reply(reply);
        Ok(())
    }
}

impl<E: Engine> Drop for Handler<E> {
    fn drop(&mut self) {
        self.stop_handshake_deadline();
        self.shared.metrics.connection_closed();
    }
}

/// Bytes a held request keeps alive (its keys and values).
fn request_bytes(request: &Request) -> usize {
    let mut buf = BytesMut::new();
    request.encode(&mut buf);
    buf.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::server::shutdown;

    /// A storm keeps one of these futures alive per rank: 16384 ranks at 1 KiB each was most
    /// of the server's memory. tokio rounds a task up to 128 bytes; at 288 bytes or less it
    /// takes 384.
    #[test]
    fn a_connections_future_stays_small() {
        let runtime = crate::runtime::runtime();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let stream = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (_trigger, shutdown, _drain) = shutdown::channel();
            let handler: Handler = Handler::new(stream, Db::new(), Arc::default());
            let future = handler.run(shutdown);
            let size = std::mem::size_of_val(&future);
            assert!(size <= 288, "a connection's future grew to {size} bytes");
        });
    }
}
