//! The registry of pending waits: which waits still miss which key, and whom to wake.
//!
//! Every operation costs time in proportion to the waits it releases, never to the waits that
//! stay or leave. That matters when a job gives up: 16,384 ranks cancelling their WAIT on one
//! key at once used to scan that key's list once per rank (O(n²), 141 ms under the store lock).
//! Now a cancelled wait leaves its entry in the key's list as a tombstone, the key keeps a count
//! of live entries, and a list is compacted only once tombstones outnumber the living, so each
//! cancel is O(1) amortized.
//!
//! A wait on many keys keeps them in a hash set, so each arriving key strikes it in O(1): a WAIT
//! on 100,000 keys costs O(keys) in all, not the O(keys²) of rescanning a list per key. A wait
//! on a few keys (every rank of a rendezvous) keeps a plain list, which is smaller.
//!
//! A wait's slot is reused after its handle is dropped, so each registration also gets a ticket
//! that is never reused: an old entry whose ticket does not match its slot is a tombstone, and
//! cannot wake the wait that took the slot over (the stale-registration bug of torch's libuv
//! server).

use std::collections::{HashMap, HashSet, VecDeque};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use slab::Slab;

/// A registered wait: the keys it still misses, and whom to wake when none are left.
///
/// It stays in the slab until its handle is dropped, so its slot (the wait's id) is never reused
/// while the handle could still look at it. Kept small: a rendezvous storm holds one per rank.
struct Pending {
    missing: Missing,
    ticket: u64,
    released: bool,
    waker: Option<Waker>,
}

/// Waits on at most this many keys keep them in a list; larger ones in a hash set.
const FEW_KEYS: usize = 16;

/// The keys a wait still misses.
enum Missing {
    /// A short list: scanning it is cheaper than hashing.
    Few(Vec<Bytes>),
    /// Many keys: each strike and lookup is O(1).
    Many(HashSet<Bytes>),
}

impl Missing {
    fn new(keys: Vec<Bytes>) -> Missing {
        if keys.len() <= FEW_KEYS {
            Missing::Few(keys)
        } else {
            Missing::Many(keys.into_iter().collect())
        }
    }

    fn len(&self) -> usize {
        match self {
            Missing::Few(keys) => keys.len(),
            Missing::Many(keys) => keys.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn contains(&self, key: &[u8]) -> bool {
        match self {
            Missing::Few(keys) => keys.iter().any(|k| k.as_ref() == key),
            Missing::Many(keys) => keys.contains(key),
        }
    }

    fn strike(&mut self, key: &[u8]) {
        match self {
            Missing::Few(keys) => keys.retain(|k| k.as_ref() != key),
            Missing::Many(keys) => {
                keys.remove(key);
            }
        }
    }

    fn keys(&self) -> Vec<&Bytes> {
        match self {
            Missing::Few(keys) => keys.iter().collect(),
            Missing::Many(keys) => keys.iter().collect(),
        }
    }
}

/// One wait's place in a key's list.
#[derive(Clone, Copy)]
struct Entry {
    id: usize,
    ticket: u64,
}

/// The waits on one key, oldest first, tombstones included; `live` counts the others.
struct KeyWaits {
    entries: VecDeque<Entry>,
    live: usize,
}

/// Tombstones a list may hold beyond its live entries before it is compacted.
const SLACK: usize = 32;

#[derive(Default)]
pub struct Registry {
    by_key: HashMap<Bytes, KeyWaits>,
    pending: Slab<Pending>,
    next_ticket: u64,
}

impl Registry {
    /// Registers a wait for every key in `missing` (distinct, none present); returns its id.
    pub fn register(&mut self, missing: Vec<Bytes>) -> usize {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        for key in &missing {
            let waits = self.by_key.entry(key.clone()).or_insert_with(|| KeyWaits {
                entries: VecDeque::new(),
                live: 0,
            });
            waits.live += 1;
            waits.entries.push_back(Entry {
                id: self.pending.vacant_key(),
                ticket,
            });
        }
        self.pending.insert(Pending {
            missing: Missing::new(missing),
            ticket,
            released: false,
            waker: None,
        })
    }

    /// `key` is now present: every wait on it stops missing it.
    pub fn wake(&mut self, key: &[u8]) {
        if self.by_key.is_empty() {
            return; // nobody waits: a write pays no hashing for the registry
        }
        let Some(waits) = self.by_key.remove(key) else {
            return;
        };
        for entry in waits.entries {
            self.strike(entry, key);
        }
    }

    /// One element arrived under `key` (a queue push): waits on it stop missing it in arrival
    /// order, until one of them is fully released.
    pub fn wake_one(&mut self, key: &[u8]) {
        if self.by_key.is_empty() {
            return;
        }
        let Some(waits) = self.by_key.get_mut(key) else {
            return;
        };
        let mut struck = Vec::new();
        while let Some(entry) = waits.entries.pop_front() {
            let Some(p) = self
                .pending
                .get(entry.id)
                .filter(|p| p.ticket == entry.ticket)
            else {
                continue; // a tombstone
            };
            waits.live -= 1;
            struck.push(entry);
            if p.missing.len() == 1 {
                break;
            }
        }
        if waits.live == 0 {
            self.by_key.remove(key);
        }
        for entry in struck {
            self.strike(entry, key);
        }
    }

    /// The wait behind `entry`, if it is still that wait, no longer misses `key`.
    fn strike(&mut self, entry: Entry, key: &[u8]) {
        let Some(p) = self.pending.get_mut(entry.id) else {
            return;
        };
        if p.ticket != entry.ticket {
            return;
        }
        p.missing.strike(key);
        if p.missing.is_empty() && !p.released {
            p.released = true;
            if let Some(waker) = p.waker.take() {
                waker.wake();
            }
        }
    }

    /// Ready once wait `id` misses nothing; otherwise `cx` is woken when it does.
    pub fn poll_released(&mut self, id: usize, cx: &mut Context<'_>) -> Poll<()> {
        let pending = &mut self.pending[id];
        if pending.released {
            return Poll::Ready(());
        }
        match &mut pending.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    #[cfg(test)]
    pub fn is_released(&self, id: usize) -> bool {
        self.pending[id].released
    }

    /// Forgets wait `id` (its handle was dropped): its entries become tombstones.
    pub fn remove(&mut self, id: usize) {
        let gone = self.pending.remove(id);
        for key in gone.missing.keys() {
            let Some(waits) = self.by_key.get_mut(key) else {
                continue;
            };
            waits.live -= 1;
            if waits.live == 0 {
                self.by_key.remove(key);
            } else if waits.entries.len() > 2 * waits.live + SLACK {
                let pending = &self.pending;
                waits.entries.retain(|e| {
                    pending
                        .get(e.id)
                        .is_some_and(|p| p.ticket == e.ticket && p.missing.contains(key))
                });
            }
        }
    }

    /// Waits not yet released.
    pub fn pending_count(&self) -> usize {
        self.pending.iter().filter(|(_, p)| !p.released).count()
    }

    /// Entries (live and tombstones) over every key; for tests of the bookkeeping.
    #[cfg(test)]
    fn entry_count(&self) -> usize {
        self.by_key.values().map(|w| w.entries.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keys(names: &[&str]) -> Vec<Bytes> {
        names
            .iter()
            .map(|n| Bytes::copy_from_slice(n.as_bytes()))
            .collect()
    }

    /// The fault hunt's many-key WAIT: 100,000 keys took 40.8 s of server time when each
    /// arriving key rescanned the list; with a set it is linear (tens of ms, debug build).
    #[test]
    fn a_wait_on_many_keys_is_released_by_the_last_one_in_linear_time() {
        let mut registry = Registry::default();
        let keys: Vec<Bytes> = (0..100_000)
            .map(|i| Bytes::from(format!("/k{i}")))
            .collect();
        let id = registry.register(keys.clone());
        let started = std::time::Instant::now();
        for key in &keys[..keys.len() - 1] {
            registry.wake(key);
        }
        assert!(!registry.is_released(id));
        registry.wake(&keys[keys.len() - 1]);
        assert!(registry.is_released(id));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
        registry.remove(id);
        assert_eq!(registry.entry_count(), 0);
    }

    #[test]
    fn cancelling_every_wait_on_a_key_leaves_nothing_and_never_piles_up_tombstones() {
        let mut registry = Registry::default();
        let ids: Vec<usize> = (0..10_000)
            .map(|_| registry.register(keys(&["go"])))
            .collect();
        for (dropped, id) in ids.into_iter().enumerate() {
            registry.remove(id);
            let live = 10_000 - dropped - 1;
            assert!(registry.entry_count() <= 2 * live + SLACK + 1);
        }
        assert_eq!(registry.entry_count(), 0);
        assert!(registry.by_key.is_empty());
    }

    #[test]
    fn a_tombstone_does_not_stand_for_the_wait_that_took_its_slot() {
        let mut registry = Registry::default();
        let old = registry.register(keys(&["q"]));
        let keeper = registry.register(keys(&["q"]));
        registry.remove(old);
        let new = registry.register(keys(&["q"]));
        assert_eq!(new, old, "the slot is reused");
        // One queue element: the oldest live wait gets it, not the newcomer in the old slot.
        registry.wake_one(b"q");
        assert!(registry.is_released(keeper));
        assert!(!registry.is_released(new));
    }

    #[test]
    fn dropping_a_half_released_wait_leaves_a_new_wait_on_its_released_key() {
        let mut registry = Registry::default();
        let both = registry.register(keys(&["a", "b"]));
        registry.wake(b"a"); // `both` now misses only b
        let later = registry.register(keys(&["a"])); // a was deleted and is waited on again
        registry.remove(both);
        registry.wake(b"a");
        assert!(registry.is_released(later));
    }

    #[test]
    fn wake_one_skips_cancelled_waits() {
        let mut registry = Registry::default();
        let first = registry.register(keys(&["q"]));
        let second = registry.register(keys(&["q"]));
        let third = registry.register(keys(&["q"]));
        registry.remove(first);
        registry.wake_one(b"q");
        assert!(registry.is_released(second));
        assert!(!registry.is_released(third));
    }

    /// What the registry must behave like: per key, the waits still missing it, oldest first.
    #[derive(Default)]
    struct Model {
        missing: HashMap<usize, Vec<u8>>,
        order: Vec<usize>,
    }

    impl Model {
        fn strike(&mut self, id: usize, key: u8) {
            if let Some(m) = self.missing.get_mut(&id) {
                m.retain(|&k| k != key);
            }
        }
        fn waiting_on(&self, key: u8) -> Vec<usize> {
            let misses = |id: &&usize| self.missing.get(id).is_some_and(|m| m.contains(&key));
            self.order.iter().filter(misses).copied().collect()
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Register(Vec<u8>),
        Remove(usize),
        Wake(u8),
        WakeOne(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            proptest::collection::btree_set(0u8..4, 1..3)
                .prop_map(|s| Op::Register(s.into_iter().collect())),
            (0usize..64).prop_map(Op::Remove),
            (0u8..4).prop_map(Op::Wake),
            (0u8..4).prop_map(Op::WakeOne),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn behaves_like_the_model(ops in proptest::collection::vec(op(), 1..200)) {
            let mut registry = Registry::default();
            let mut model = Model::default();
            let mut live: Vec<usize> = Vec::new();
            let mut peak = 0;
            for op in ops {
                match op {
                    Op::Register(ks) => {
                        let names: Vec<Bytes> = ks.iter().map(|k| Bytes::from(vec![*k])).collect();
                        let id = registry.register(names);
                        model.missing.insert(id, ks);
                        model.order.retain(|&o| o != id);
                        model.order.push(id);
                        live.push(id);
                    }
                    Op::Remove(i) if !live.is_empty() => {
                        let id = live.remove(i % live.len());
                        registry.remove(id);
                        model.missing.remove(&id);
                    }
                    Op::Remove(_) => {}
                    Op::Wake(k) => {
                        registry.wake(&[k]);
                        for id in model.waiting_on(k) {
                            model.strike(id, k);
                        }
                    }
                    Op::WakeOne(k) => {
                        registry.wake_one(&[k]);
                        for id in model.waiting_on(k) {
                            let last = model.missing[&id].len() == 1;
                            model.strike(id, k);
                            if last {
                                break;
                            }
                        }
                    }
                }
                for &id in &live {
                    prop_assert_eq!(registry.is_released(id), model.missing[&id].is_empty());
                }
                // Tombstones are bounded by the most waits there ever were, not by cancels.
                peak = peak.max(model.missing.values().map(Vec::len).sum::<usize>());
                prop_assert!(registry.entry_count() <= 2 * peak + 4 * (SLACK + 1));
            }
        }
    }
}
