//! An etcd cluster as an [`Engine`]: what `ferrodist-store --backend etcd://...` serves from.
//!
//! Each operation is a boxed future over one of the store's wire operations (`served.rs`): the
//! box costs nothing beside the etcd round trip it wraps. A WAIT's first read is part of its
//! waiter, so STOP_WAITING goes out once it ends whether the keys were there at once or came
//! later; the waiter is a watch from the read's revision (no polling), cancelled when dropped.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use super::EtcdStore;
use crate::error::Result;
use crate::store::engine::{Boxed, Call, Engine, Op, Values};

/// Serves the wire's operations from an [`EtcdStore`]; clones share its connection.
#[derive(Clone)]
pub struct EtcdEngine {
    store: Arc<EtcdStore>,
}

impl EtcdEngine {
    /// An engine over `store` (connected, on this process's runtime).
    pub fn new(store: EtcdStore) -> EtcdEngine {
        EtcdEngine {
            store: Arc::new(store),
        }
    }

    /// The store operations are served from.
    pub fn store(&self) -> &EtcdStore {
        &self.store
    }

    /// An operation on the store, in flight.
    fn later<T, F>(&self, operation: impl FnOnce(Arc<EtcdStore>) -> F) -> Call<Self, T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        Op::Later(Box::pin(operation(Arc::clone(&self.store))))
    }
}

impl Engine for EtcdEngine {
    const DURABLE: bool = true;
    type Waiter = Boxed<()>;
    type Later<T: Send + 'static> = Boxed<T>;

    fn then<T: Send + 'static, U: Send + 'static>(
        later: Boxed<T>,
        then: impl FnOnce(Result<T>) -> U + Send + 'static,
    ) -> Boxed<U> {
        Box::pin(async move { Ok(then(later.await)) })
    }

    fn poll_released(waiter: &mut Boxed<()>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        waiter.as_mut().poll(cx)
    }

    fn set(&self, key: Bytes, value: Bytes) -> Call<Self, ()> {
        self.later(|s| async move { s.wire_set(&key, &value).await })
    }

    fn get(&self, key: Bytes) -> Call<Self, Bytes> {
        self.later(|s| async move { s.wire_get(&key).await })
    }

    fn add(&self, key: Bytes, delta: i64) -> Call<Self, i64> {
        self.later(|s| async move { s.wire_add(&key, delta).await })
    }

    fn compare_set(&self, key: Bytes, expected: Bytes, desired: Bytes) -> Call<Self, Bytes> {
        self.later(|s| async move { s.wire_compare_set(&key, &expected, &desired).await })
    }

    fn check(&self, keys: Vec<Bytes>) -> Call<Self, bool> {
        self.later(|s| async move { s.wire_check(&keys).await })
    }

    fn wait(&self, keys: Vec<Bytes>) -> Option<Boxed<()>> {
        let store = Arc::clone(&self.store);
        Some(Box::pin(async move { store.wire_wait(&keys).await }))
    }

    fn num_keys(&self) -> Call<Self, i64> {
        self.later(|s| async move { s.wire_num_keys().await })
    }

    fn delete_key(&self, key: Bytes) -> Call<Self, i64> {
        self.later(|s| async move { s.wire_delete_key(&key).await })
    }

    fn append(&self, key: Bytes, value: Bytes) -> Call<Self, ()> {
        self.later(|s| async move { s.wire_append(&key, &value).await })
    }

    fn multi_get(&self, keys: Vec<Bytes>) -> Call<Self, Values> {
        self.later(|s| async move { s.wire_multi_get(&keys).await.map(Values::All) })
    }

    fn multi_set(&self, pairs: Vec<(Bytes, Bytes)>) -> Call<Self, ()> {
        self.later(|s| async move { s.wire_multi_set(&pairs).await })
    }

    fn queue_push(&self, key: Bytes, value: Bytes) -> Call<Self, ()> {
        self.later(|s| async move { s.wire_queue_push(&key, &value).await })
    }

    fn queue_pop(&self, key: Bytes) -> Call<Self, (i64, Option<Bytes>)> {
        self.later(|s| async move { s.wire_queue_pop(&key).await })
    }

    fn queue_len(&self, key: Bytes) -> Call<Self, i64> {
        self.later(|s| async move { s.wire_queue_len(&key).await })
    }

    fn list_keys(&self) -> Call<Self, Vec<Bytes>> {
        self.later(|s| async move { s.wire_list_keys().await })
    }

    fn barrier(&self, key: Bytes, world_size: i64) -> Call<Self, Option<Boxed<()>>> {
        self.later(|s| async move {
            if s.wire_barrier_arrive(&key, world_size).await? {
                return Ok(None);
            }
            let waiter: Boxed<()> =
                Box::pin(async move { s.wire_counter_at_least(&key, world_size).await });
            Ok(Some(waiter))
        })
    }
}
