//! The one way from the wire to a storage [`Engine`]: each data request becomes an engine
//! operation, and its result becomes torch's reply.
//!
//! Whichever engine holds the keys (in memory, or etcd), the requests, replies and refusals are
//! these. An operation the engine answers at once is [`Served::Now`]; one in flight is
//! [`Served::Later`], which the connection polls (and serves nothing else until it is ready).
//! The handler keeps what is the protocol's (the handshake, PING, CANCEL_WAIT, the requests
//! held behind a pending wait); the dispatcher sees only the data requests, one at a time per
//! connection and in the order they came.

use std::time::Instant;

use super::handler::Closed;
use crate::error::Error;
use crate::store::engine::{Call, Engine, Op, ValueSource, Values};
use crate::tcp::codec::{Opcode, Reply, Request, NOT_READY, READY, STOP_WAITING};

/// What a served request leaves for the connection to do.
pub enum Outcome<W> {
    /// Send this reply.
    Reply(Reply),
    /// Send nothing (SET, APPEND, MULTI_SET, QUEUE_PUSH have no reply in torch's protocol).
    Silent,
    /// A WAIT or BARRIER that is not released yet: STOP_WAITING goes out when `W` is.
    Waiting(W),
    /// A reply of values read as the peer takes them (a MULTI_GET of many keys).
    Stream(Box<dyn ValueSource>),
}

/// A served request: its outcome, or the refusal that closes the connection.
pub type Answer<W> = Result<Outcome<W>, Closed>;

/// A request that was in flight, done: its answer, and what the metrics count it as.
pub struct Finished<W> {
    /// The answer.
    pub answer: Answer<W>,
    /// The request's opcode.
    pub opcode: Opcode,
    /// When serving it began.
    pub since: Instant,
}

/// A request's answer now, or the operation in flight that gives it.
pub enum Served<E: Engine> {
    /// Answered while serving it.
    Now(Answer<E::Waiter>),
    /// Still in flight: the connection polls it.
    Later(E::Later<Finished<E::Waiter>>),
}

/// Serves one data request (never VALIDATE, PING or CANCEL_WAIT: the handler answers those).
pub fn serve<E: Engine>(engine: &E, request: Request) -> Served<E> {
    let opcode = request.opcode();
    match request {
        Request::Set { key, value } => silent(engine.set(key, value), opcode),
        Request::CompareSet {
            key,
            expected,
            desired,
        } => answer(
            engine.compare_set(key, expected, desired),
            opcode,
            reply(Reply::Value),
        ),
        Request::Get { key } => answer(engine.get(key), opcode, reply(Reply::Value)),
        Request::Add { key, delta } => answer(engine.add(key, delta), opcode, reply(Reply::Int)),
        Request::Check { keys } => answer(engine.check(keys), opcode, |ready| {
            Outcome::Reply(Reply::Byte(if ready { READY } else { NOT_READY }))
        }),
        Request::Wait { keys } => Served::Now(Ok(released_or(engine.wait(keys)))),
        Request::GetNumKeys => answer(engine.num_keys(), opcode, reply(Reply::Int)),
        Request::DeleteKey { key } => answer(engine.delete_key(key), opcode, reply(Reply::Int)),
        Request::Append { key, value } => silent(engine.append(key, value), opcode),
        Request::MultiGet { keys } => {
            answer(engine.multi_get(keys), opcode, |values| match values {
                Values::All(values) => Outcome::Reply(Reply::Values(values)),
                Values::Windows(source) => Outcome::Stream(source),
            })
        }
        Request::MultiSet { pairs } => silent(engine.multi_set(pairs), opcode),
        Request::QueuePush { key, value } => silent(engine.queue_push(key, value), opcode),
        Request::QueuePop { key } => answer(engine.queue_pop(key), opcode, |(len, value)| {
            Outcome::Reply(Reply::Popped {
                len_before: len,
                value,
            })
        }),
        Request::QueueLen { key } => answer(engine.queue_len(key), opcode, reply(Reply::Int)),
        Request::ListKeys => answer(engine.list_keys(), opcode, reply(Reply::Keys)),
        Request::Barrier { key, world_size } => {
            answer(engine.barrier(key, world_size), opcode, released_or)
        }
        Request::Validate { .. } | Request::Ping { .. } | Request::CancelWait => {
            Served::Now(Err(not_data(&request)))
        }
    }
}

/// A reply built from the operation's value.
fn reply<T: 'static, W>(into: fn(T) -> Reply) -> impl FnOnce(T) -> Outcome<W> + Send + 'static {
    move |value| Outcome::Reply(into(value))
}

/// STOP_WAITING now, or the wait.
fn released_or<W>(waiter: Option<W>) -> Outcome<W> {
    match waiter {
        None => Outcome::Reply(Reply::Byte(STOP_WAITING)),
        Some(waiter) => Outcome::Waiting(waiter),
    }
}

/// A request with no reply.
fn silent<E: Engine>(call: Call<E, ()>, opcode: Opcode) -> Served<E> {
    answer(call, opcode, |()| Outcome::Silent)
}

/// The outcome of an operation, now or when it is done.
fn answer<E: Engine, T: Send + 'static>(
    call: Call<E, T>,
    opcode: Opcode,
    into: impl FnOnce(T) -> Outcome<E::Waiter> + Send + 'static,
) -> Served<E> {
    match call {
        Op::Now(result) => Served::Now(result.map(into).map_err(closed)),
        Op::Later(later) => {
            let since = Instant::now();
            Served::Later(E::then(later, move |result| Finished {
                answer: result.map(into).map_err(closed),
                opcode,
                since,
            }))
        }
    }
}

/// Why a request failed: the client's request (refused and closed, as torch's servers do) or
/// the engine (etcd without quorum past the store's timeout).
pub fn closed(err: Error) -> Closed {
    if matches!(err, Error::InvalidArgument(_)) {
        Closed::Refused(err.to_string())
    } else {
        Closed::Backend(err.to_string())
    }
}

/// A protocol request that reached the dispatcher (a handler bug, not the client's).
fn not_data(request: &Request) -> Closed {
    Closed::Refused(format!(
        "{:?} is not served by the store engine",
        request.opcode()
    ))
}
