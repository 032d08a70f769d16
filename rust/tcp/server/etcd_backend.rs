//! The etcd backend: a server whose every request is served from an etcd cluster through an
//! [`EtcdStore`] (`ferrodist-store --backend etcd://...`).
//!
//! The server then holds no state of its own. A server that is killed and started again, or a
//! second one on another port or host, serves every key a client was ever answered about: a
//! connection serves its requests in order, so by the time any reply goes out, every write the
//! client sent before it is committed in etcd (SET has no reply, but the next request's reply
//! waits for it).
//!
//! Each request is a boxed future the connection polls: the box costs nothing beside the etcd
//! round trip it wraps, and the in-memory backend is not affected. A WAIT is a read and a watch
//! from its revision (no polling); a pending WAIT is dropped, and its watch cancelled, when the
//! client sends CANCEL_WAIT or leaves. A request etcd cannot serve within the store's timeout
//! (a cluster without quorum) closes the connection, which is all torch's protocol can say; a
//! client that connects again is served once etcd is back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::backend::{not_data, Answer, Backend, Finished, Outcome, Served};
use super::handler::Closed;
use crate::error::Error;
use crate::store::etcd::served::refused_request;
use crate::store::EtcdStore;
use crate::tcp::codec::{Reply, Request, NOT_READY, READY, STOP_WAITING};

/// A pending WAIT or BARRIER on etcd.
pub type EtcdWaiter = Pin<Box<dyn Future<Output = Result<(), Closed>> + Send>>;

/// A request in flight to etcd.
pub type EtcdPending = Pin<Box<dyn Future<Output = Finished<EtcdWaiter>> + Send>>;

/// Serves requests from an [`EtcdStore`]; clones share its connection.
#[derive(Clone)]
pub struct EtcdBackend {
    store: Arc<EtcdStore>,
}

impl EtcdBackend {
    /// A backend over `store` (connected, on this process's runtime).
    pub fn new(store: EtcdStore) -> EtcdBackend {
        EtcdBackend {
            store: Arc::new(store),
        }
    }

    /// The store requests are served from.
    pub fn store(&self) -> &EtcdStore {
        &self.store
    }
}

/// Why a request failed: the client's request (refused, as torch's servers refuse it) or etcd.
fn closed(err: Error) -> Closed {
    if refused_request(&err) {
        Closed::Refused(err.to_string())
    } else {
        Closed::Backend(err.to_string())
    }
}

fn reply<T>(result: crate::error::Result<T>, into: impl FnOnce(T) -> Reply) -> Answer<EtcdWaiter> {
    result.map(|t| Outcome::Reply(into(t))).map_err(closed)
}

fn silent(result: crate::error::Result<()>) -> Answer<EtcdWaiter> {
    result.map(|()| Outcome::Silent).map_err(closed)
}

async fn answer(store: Arc<EtcdStore>, request: Request) -> Answer<EtcdWaiter> {
    match request {
        Request::Set { key, value } => silent(store.wire_set(&key, &value).await),
        Request::CompareSet {
            key,
            expected,
            desired,
        } => reply(
            store.wire_compare_set(&key, &expected, &desired).await,
            Reply::Value,
        ),
        Request::Get { key } => reply(store.wire_get(&key).await, Reply::Value),
        Request::Add { key, delta } => reply(store.wire_add(&key, delta).await, Reply::Int),
        Request::Check { keys } => reply(store.wire_check(&keys).await, |ready| {
            Reply::Byte(if ready { READY } else { NOT_READY })
        }),
        Request::GetNumKeys => reply(store.wire_num_keys().await, Reply::Int),
        Request::DeleteKey { key } => reply(store.wire_delete_key(&key).await, Reply::Int),
        Request::Append { key, value } => silent(store.wire_append(&key, &value).await),
        Request::MultiGet { keys } => reply(store.wire_multi_get(&keys).await, Reply::Values),
        Request::MultiSet { pairs } => silent(store.wire_multi_set(&pairs).await),
        Request::QueuePush { key, value } => silent(store.wire_queue_push(&key, &value).await),
        Request::QueuePop { key } => reply(store.wire_queue_pop(&key).await, |(len, value)| {
            Reply::Popped {
                len_before: len,
                value,
            }
        }),
        Request::QueueLen { key } => reply(store.wire_queue_len(&key).await, Reply::Int),
        Request::ListKeys => reply(store.wire_list_keys().await, Reply::Keys),
        Request::Barrier { key, world_size } => {
            match store.wire_barrier_arrive(&key, world_size).await {
                Ok(true) => Ok(Outcome::Reply(Reply::Byte(STOP_WAITING))),
                Ok(false) => {
                    let waiter: EtcdWaiter = Box::pin(async move {
                        store
                            .wire_counter_at_least(&key, world_size)
                            .await
                            .map_err(closed)
                    });
                    Ok(Outcome::Waiting(waiter))
                }
                Err(err) => Err(closed(err)),
            }
        }
        // WAIT never gets here (see `serve`); the protocol's own requests never reach a backend.
        request => Err(not_data(&request)),
    }
}

impl Backend for EtcdBackend {
    const DURABLE: bool = true;
    type Waiter = EtcdWaiter;
    type Pending = EtcdPending;

    fn serve(&self, request: Request) -> Served<Self> {
        let store = Arc::clone(&self.store);
        match request {
            // The wait's first read is part of the waiter: STOP_WAITING goes out once it ends,
            // whether the keys were there at once or came later.
            Request::Wait { keys } => {
                let waiter: EtcdWaiter =
                    Box::pin(async move { store.wire_wait(&keys).await.map_err(closed) });
                Served::Now(Ok(Outcome::Waiting(waiter)))
            }
            request => {
                let (opcode, since) = (request.opcode(), Instant::now());
                let pending: EtcdPending = Box::pin(async move {
                    let answer = answer(store, request).await;
                    Finished {
                        answer,
                        opcode,
                        since,
                    }
                });
                Served::Later(pending)
            }
        }
    }

    fn poll_released(waiter: &mut EtcdWaiter, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        waiter.as_mut().poll(cx)
    }
}
