//! EtcdStore's side of the stores' one blocking facade ([`crate::store::facade`]): how it looks
//! for keys, what a wait is (a watch), and how a thread blocks on one.
//!
//! Python notices Ctrl-C only when a thread takes the GIL and checks for it. Slicing a wait
//! here would read the keys again and set up a new watch for every slice: a round trip each,
//! and with a thousand ranks waiting in a rendezvous, ten thousand new watches a second. So a
//! wait keeps one watch for its whole timeout, and the thread that blocks on it wakes every
//! [`INTERRUPT_POLL`] to run the check beside it; an interrupt drops the wait (and so cancels
//! its watch) at once.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use super::{EtcdStore, SHORTEST_CALL_DEADLINE};
use crate::error::Result;
use crate::runtime::runtime;
use crate::store::facade::BlockingEngine;
use crate::store::{Deadline, INTERRUPT_POLL};

/// A wait on etcd: the keys to watch, and what the read that found them missing saw (the
/// watch then starts from its revision, without reading again).
pub struct EtcdWait {
    keys: Vec<Bytes>,
    read: Option<Vec<Option<i64>>>,
}

impl EtcdWait {
    fn for_keys(keys: &[Bytes]) -> EtcdWait {
        EtcdWait {
            keys: keys.to_vec(),
            read: None,
        }
    }
}

impl EtcdStore {
    /// Runs `waiting` on this thread until it ends, `timeout` (zero: never) passes (`None`) or
    /// `interrupted` fails (its error), calling `interrupted` every [`INTERRUPT_POLL`].
    pub(super) fn watching<T>(
        &self,
        waiting: impl Future<Output = Result<T>>,
        timeout: Duration,
        mut interrupted: Option<&mut (dyn FnMut() -> Result<()> + '_)>,
    ) -> Option<Result<T>> {
        let deadline = Deadline::after(timeout);
        runtime().block_on(async {
            let mut waiting = std::pin::pin!(waiting);
            loop {
                let slice = match deadline.remaining() {
                    Some(left) if left.is_zero() => return None,
                    Some(left) if interrupted.is_none() => left,
                    Some(left) => left.min(INTERRUPT_POLL),
                    None => INTERRUPT_POLL,
                };
                if let Ok(done) = tokio::time::timeout(slice, waiting.as_mut()).await {
                    return Some(done);
                }
                if let Some(interrupted) = interrupted.as_deref_mut() {
                    if let Err(err) = interrupted() {
                        return Some(Err(err));
                    }
                }
            }
        })
    }
}

impl BlockingEngine for EtcdStore {
    type Wait = EtcdWait;

    /// One snapshot; a wait on every key when one is missing (its first read finds which).
    fn values_or_wait(&self, keys: &[Bytes]) -> Result<Result<Vec<Bytes>, EtcdWait>> {
        let values = runtime().block_on(self.snapshot(keys))?;
        if values.iter().all(Option::is_some) {
            return Ok(Ok(values.into_iter().flatten().collect()));
        }
        Ok(Err(EtcdWait::for_keys(keys)))
    }

    fn present_or_wait(&self, keys: &[Bytes]) -> Result<Option<EtcdWait>> {
        let read = runtime().block_on(
            self.call_async("wait", |_| async { self.missing_since(keys).await.map(Ok) }),
        )?;
        if read.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(EtcdWait {
            keys: keys.to_vec(),
            read: Some(read),
        }))
    }

    fn pop_or_wait(&self, key: &Bytes) -> Result<Result<Bytes, EtcdWait>> {
        match runtime().block_on(self.wire_queue_pop(key))? {
            (_, Some(front)) => Ok(Ok(front)),
            (_, None) => Ok(Err(EtcdWait::for_keys(std::slice::from_ref(key)))),
        }
    }

    /// One watch for the whole wait (see the module doc).
    fn block(
        &self,
        wait: EtcdWait,
        deadline: Deadline,
        interrupted: Option<&mut (dyn FnMut() -> Result<()> + '_)>,
    ) -> Result<bool> {
        self.shared.usable()?;
        let timeout = match deadline.remaining() {
            Some(left) if left.is_zero() => return Ok(false),
            Some(left) => left,
            None => Duration::ZERO, // never
        };
        let waiting = self.until_present_with(&wait.keys, wait.read, std::future::ready(()));
        match self.watching(waiting, timeout, interrupted) {
            None => Ok(false),
            Some(done) => done.map(|()| true),
        }
    }

    /// Read with a short deadline of its own; all of `keys` when etcd cannot say.
    fn missing(&self, keys: &[Bytes]) -> Vec<Bytes> {
        let check =
            async { tokio::time::timeout(SHORTEST_CALL_DEADLINE, self.missing_since(keys)).await };
        match runtime().block_on(check) {
            Ok(Ok(missing)) => keys
                .iter()
                .zip(missing)
                .filter(|(_, m)| m.is_some())
                .map(|(k, _)| k.clone())
                .collect(),
            _ => keys.to_vec(),
        }
    }
}
