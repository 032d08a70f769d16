//! `wait`: read which keys are missing, then watch them from the revision of that read.
//!
//! A watch that starts at `read revision + 1` replays every write after the read, so a `set`
//! that lands between the read and the watch's creation is still seen: no lost wake-up, and no
//! polling. A key counts as present while it has a value or a non-empty queue of its name (as
//! in torch's stores), so each missing key is watched under both etcd keys. Only puts release a
//! waiter; deletes (of a key, or of a queue by its last pop) do not, as in torch.
//!
//! When the watch stream breaks (its member died, lost its leader, or the start revision was
//! compacted away) the wait reads again and watches from the new revision: whatever happened
//! in between is in that read.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use etcd_client::{EventType, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions};

use super::retry::{fatal, is_transient};
use super::EtcdStore;
use crate::error::Result;

/// etcd's default cap on the operations of one transaction (`--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;

/// Pause before reading again after a transient failure of a read or a watch.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Why a watch ended without releasing the wait.
enum Ended {
    /// Every missing key was written.
    Released,
    /// The stream broke or was cancelled: read again.
    Broken,
}

impl EtcdStore {
    /// For each key, `None` when it is present now, else the revision of the read that found it
    /// missing. Keys are read in transactions of at most [`MAX_TXN_OPS`] lookups.
    pub(super) async fn missing_since<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
    ) -> std::result::Result<Vec<Option<i64>>, etcd_client::Error> {
        let mut kv = self.shared.client.kv_client();
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_TXN_OPS / 2) {
            let lookups: Vec<TxnOp> = chunk
                .iter()
                .flat_map(|k| [self.layout.value(k.as_ref()), self.layout.queue(k.as_ref())])
                .map(|etcd_key| {
                    TxnOp::get(
                        etcd_key,
                        Some(etcd_client::GetOptions::new().with_count_only()),
                    )
                })
                .collect();
            let response = kv.txn(Txn::new().and_then(lookups)).await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let counts: Vec<i64> = response
                .op_responses()
                .iter()
                .map(|r| match r {
                    TxnOpResponse::Get(get) => get.count(),
                    _ => 0,
                })
                .collect();
            out.extend(
                counts
                    .chunks(2)
                    .map(|pair| (pair.iter().sum::<i64>() == 0).then_some(revision)),
            );
        }
        Ok(out)
    }

    /// Returns once every key is present; runs until then (the caller bounds it).
    pub(super) async fn until_present<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<()> {
        self.until_present_with(keys, None, std::future::ready(()))
            .await
    }

    /// [`EtcdStore::until_present`]. `read` is what a read just found (from
    /// [`EtcdStore::missing_since`]), so the wait starts with the watch; `gap` is awaited once
    /// between the first read that finds a key missing and the watch (tests land a write in
    /// exactly that gap).
    pub(super) async fn until_present_with<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        mut read: Option<Vec<Option<i64>>>,
        gap: impl std::future::Future<Output = ()>,
    ) -> Result<()> {
        let mut gap = Some(gap);
        loop {
            let missing = match read.take() {
                Some(missing) => missing,
                None => match self.missing_since(keys).await {
                    Ok(missing) => missing,
                    Err(err) if is_transient(&err) => {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                    Err(err) => return Err(fatal("wait", err)),
                },
            };
            let waiting: Vec<(&[u8], i64)> = keys
                .iter()
                .zip(&missing)
                .filter_map(|(k, m)| m.map(|revision| (k.as_ref(), revision)))
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            if let Some(gap) = gap.take() {
                gap.await;
            }
            match self.watch_until_written(&waiting).await {
                Ok(Ended::Released) => return Ok(()),
                Ok(Ended::Broken) => {}
                Err(err) if is_transient(&err) => {}
                Err(err) => return Err(fatal("wait", err)),
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Watches each `(key, revision)` from `revision + 1` until every key has been written.
    async fn watch_until_written(
        &self,
        waiting: &[(&[u8], i64)],
    ) -> std::result::Result<Ended, etcd_client::Error> {
        let mut targets: HashMap<Vec<u8>, usize> = HashMap::new();
        for (index, (key, _)) in waiting.iter().enumerate() {
            targets.insert(self.layout.value(key), index);
            targets.insert(self.layout.queue(key), index);
        }
        let mut left: HashSet<usize> = (0..waiting.len()).collect();
        let mut client = self.shared.client.watch_client();
        let mut stream = None;
        for (key, revision) in waiting {
            for etcd_key in [self.layout.value(key), self.layout.queue(key)] {
                let options = WatchOptions::new()
                    .with_start_revision(revision + 1)
                    .with_filters([WatchFilterType::NoDelete]);
                match stream.as_mut() {
                    None => stream = Some(client.watch(etcd_key, Some(options)).await?),
                    Some(open) => open.watch(etcd_key, Some(options)).await?,
                }
            }
        }
        let Some(mut stream) = stream else {
            return Ok(Ended::Released);
        };
        while let Some(response) = stream.message().await? {
            if response.canceled() {
                return Ok(Ended::Broken);
            }
            for event in response.events() {
                if event.event_type() != EventType::Put {
                    continue;
                }
                if let Some(index) = event.kv().and_then(|kv| targets.get(kv.key())) {
                    left.remove(index);
                }
            }
            if left.is_empty() {
                return Ok(Ended::Released);
            }
        }
        Ok(Ended::Broken)
    }
}
