//! The key-value map of [`super::db`], laid out for memory: a store holds one key per rank,
//! per barrier, per collective, so what one small key costs is the server's footprint.
//!
//! A `HashMap<Bytes, Bytes>` cost 216 B per 17-byte key with an 8-byte value (torch's server,
//! a `std::unordered_map<std::string, std::vector<uint8_t>>`, 124 B): a 64-byte slot of two
//! `Bytes`, plus the copied request frame both of them pointed into, plus the `Shared` header
//! `Bytes` allocates when a frame is sliced. Here a small entry is one allocation holding the
//! key followed by the value, in a 24-byte slot. A value of [`SHARE_VALUES_FROM`] bytes or more
//! stays a shared [`Bytes`] (behind one pointer in the slot), so a GET of a large value still
//! copies nothing: the reply is written from the stored memory.
//!
//! Values shorter than that are copied out on a read, which costs what the `Bytes` clone did
//! (one allocation against one atomic increment and a later decrement), and the server's
//! outbox copies such values into its write buffer anyway.

use std::hash::{BuildHasher, RandomState};
use std::io::Write;

use bytes::{Bytes, BytesMut};
use hashbrown::hash_table::{Entry as Slot, HashTable};

/// Values at least this long are kept shared (zero-copy replies); shorter ones are packed with
/// their key. The server's outbox copies values under the same size into its write buffer.
pub const SHARE_VALUES_FROM: usize = 4 * 1024;

/// One key and its value.
enum Entry {
    /// The key, then the value, in one allocation.
    Packed { bytes: Box<[u8]>, key_len: u32 },
    /// A large value, kept shared.
    Shared(Box<SharedEntry>),
}

struct SharedEntry {
    key: Box<[u8]>,
    value: Bytes,
}

impl Entry {
    fn new(key: &[u8], value: Bytes) -> Entry {
        match u32::try_from(key.len()) {
            Ok(key_len) if value.len() < SHARE_VALUES_FROM => Entry::packed(key, key_len, &value),
            _ => Entry::Shared(Box::new(SharedEntry {
                key: key.into(),
                value,
            })),
        }
    }

    fn packed(key: &[u8], key_len: u32, value: &[u8]) -> Entry {
        let mut bytes = Vec::with_capacity(key.len() + value.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(value);
        Entry::Packed {
            bytes: bytes.into_boxed_slice(),
            key_len,
        }
    }

    fn key(&self) -> &[u8] {
        match self {
            Entry::Packed { bytes, key_len } => &bytes[..*key_len as usize],
            Entry::Shared(entry) => &entry.key,
        }
    }

    fn value(&self) -> &[u8] {
        match self {
            Entry::Packed { bytes, key_len } => &bytes[*key_len as usize..],
            Entry::Shared(entry) => &entry.value,
        }
    }

    /// The value as `Bytes`: shared when large, a copy when small.
    fn value_bytes(&self) -> Bytes {
        match self {
            Entry::Packed { .. } => Bytes::copy_from_slice(self.value()),
            Entry::Shared(entry) => entry.value.clone(),
        }
    }
}

/// Keys and their values: a table of entries hashed by key alone, searched with a `&[u8]`.
///
/// A `HashTable` rather than a `HashSet`: the set could only take an entry out and put it back
/// to change it in place (two lookups per ADD); the table hands out `&mut Entry` from one.
/// Keys come from clients, so the hasher stays std's keyed SipHash (`RandomState`).
#[derive(Default)]
pub struct Entries {
    table: HashTable<Entry>,
    hasher: RandomState,
}

impl Entries {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn find(&self, key: &[u8]) -> Option<&Entry> {
        self.table.find(self.hash(key), |e| e.key() == key)
    }

    fn slot(&mut self, key: &[u8]) -> Slot<'_, Entry> {
        let hash = self.hash(key);
        let hasher = &self.hasher;
        self.table
            .entry(hash, |e| e.key() == key, |e| hasher.hash_one(e.key()))
    }

    /// Stores `entry` under its key, replacing any value the key had.
    fn put(&mut self, entry: Entry) {
        match self.slot(entry.key()) {
            Slot::Occupied(mut occupied) => *occupied.get_mut() = entry,
            Slot::Vacant(vacant) => {
                vacant.insert(entry);
            }
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True if `key` has a value.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.find(key).is_some()
    }

    /// The value of `key`, borrowed.
    pub fn value(&self, key: &[u8]) -> Option<&[u8]> {
        self.find(key).map(Entry::value)
    }

    /// The value of `key`, owned: large values are shared, small ones copied.
    pub fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.find(key).map(Entry::value_bytes)
    }

    /// Appends the value of each of `keys` to `out` (empty for a missing key). Small values are
    /// copied into one buffer that their `Bytes` share: one allocation for the lot, not one per
    /// value, which is what keeps a MULTI_GET's time under the store's lock short.
    pub fn get_many(&self, keys: &[Bytes], out: &mut Vec<Bytes>) {
        let found: Vec<Option<&Entry>> = keys.iter().map(|k| self.find(k)).collect();
        let small: usize = found
            .iter()
            .flatten()
            .filter(|e| matches!(e, Entry::Packed { .. }))
            .map(|e| e.value().len())
            .sum();
        let mut buf = BytesMut::with_capacity(small);
        for entry in found.iter().flatten() {
            if let Entry::Packed { .. } = entry {
                buf.extend_from_slice(entry.value());
            }
        }
        let buf = buf.freeze();
        let mut at = 0;
        out.extend(found.into_iter().map(|entry| match entry {
            None => Bytes::new(),
            Some(Entry::Shared(shared)) => shared.value.clone(),
            Some(packed) => {
                let len = packed.value().len();
                at += len;
                buf.slice(at - len..at)
            }
        }));
    }

    /// Sets `key` to `value` (which is kept shared if large, else packed with the key).
    pub fn insert(&mut self, key: &[u8], value: Bytes) {
        self.put(Entry::new(key, value));
    }

    /// Sets `key` to a copy of `value`.
    pub fn insert_slice(&mut self, key: &[u8], value: &[u8]) {
        if value.len() < SHARE_VALUES_FROM {
            if let Ok(key_len) = u32::try_from(key.len()) {
                return self.put(Entry::packed(key, key_len, value));
            }
        }
        self.insert(key, Bytes::copy_from_slice(value));
    }

    /// Sets `key` to the integer `next(old value)` gives, in ASCII digits (ADD's counter), with
    /// one lookup. A packed entry whose digits keep their length is rewritten in place, with no
    /// allocation; when `next` fails, nothing changes.
    pub fn update_counter<E>(
        &mut self,
        key: &[u8],
        next: impl FnOnce(Option<&[u8]>) -> Result<i64, E>,
    ) -> Result<i64, E> {
        let mut buf = [0u8; 20]; // i64::MIN has 20 characters
        let digits = |sum: i64, buf: &mut [u8; 20]| -> usize {
            let mut rest = &mut buf[..];
            write!(rest, "{sum}").expect("an i64 fits in 20 bytes");
            20 - rest.len()
        };
        match self.slot(key) {
            Slot::Occupied(mut occupied) => {
                let entry = occupied.get_mut();
                let sum = next(Some(entry.value()))?;
                let written = digits(sum, &mut buf);
                match entry {
                    Entry::Packed { bytes, key_len }
                        if bytes.len() - *key_len as usize == written =>
                    {
                        bytes[*key_len as usize..].copy_from_slice(&buf[..written]);
                    }
                    _ => *entry = Entry::new(key, Bytes::copy_from_slice(&buf[..written])),
                }
                Ok(sum)
            }
            Slot::Vacant(vacant) => {
                let sum = next(None)?;
                let written = digits(sum, &mut buf);
                vacant.insert(Entry::new(key, Bytes::copy_from_slice(&buf[..written])));
                Ok(sum)
            }
        }
    }

    /// Removes `key`; true if it had a value.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.slot(key) {
            Slot::Occupied(occupied) => {
                occupied.remove();
                true
            }
            Slot::Vacant(_) => false,
        }
    }

    /// Appends `data` to the value of `key` (an empty value when missing). A value that has
    /// grown large is extended in place when nothing else holds it (no reply still being
    /// written), so a run of appends costs O(bytes) in all, not a copy of the value per append.
    pub fn append(&mut self, key: &[u8], data: &[u8]) {
        let Slot::Occupied(mut occupied) = self.slot(key) else {
            return self.insert_slice(key, data);
        };
        let entry = occupied.get_mut();
        let mut value = match entry {
            Entry::Packed { bytes, key_len } => {
                if bytes.len() - *key_len as usize + data.len() < SHARE_VALUES_FROM {
                    let mut grown = Vec::with_capacity(bytes.len() + data.len());
                    grown.extend_from_slice(bytes);
                    grown.extend_from_slice(data);
                    *bytes = grown.into_boxed_slice();
                    return;
                }
                BytesMut::from(&bytes[*key_len as usize..])
            }
            Entry::Shared(shared) => match std::mem::take(&mut shared.value).try_into_mut() {
                Ok(unique) => unique,
                Err(still_shared) => BytesMut::from(still_shared.as_ref()),
            },
        };
        value.extend_from_slice(data);
        *entry = Entry::new(key, value.freeze());
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.table.iter().map(Entry::key)
    }

    /// Every key with its value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.table.iter().map(|e| (e.key(), e.value()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_entry_is_one_allocation_in_a_24_byte_slot() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
        let mut entries = Entries::default();
        entries.insert(b"/key", Bytes::from_static(b"value"));
        assert!(matches!(entries.find(b"/key"), Some(Entry::Packed { .. })));
        assert_eq!(entries.value(b"/key"), Some(&b"value"[..]));
        assert_eq!(entries.value(b"/ke"), None);
    }

    #[test]
    fn a_large_value_is_shared_not_copied() {
        let mut entries = Entries::default();
        let big = Bytes::from(vec![1u8; SHARE_VALUES_FROM]);
        entries.insert(b"big", big.clone());
        let got = entries.get(b"big").unwrap();
        assert_eq!(got.as_ptr(), big.as_ptr());
    }

    #[test]
    fn appends_cross_from_packed_to_shared_and_keep_every_byte() {
        let mut entries = Entries::default();
        let chunk = [9u8; 1000];
        let mut expected = Vec::new();
        for _ in 0..10 {
            entries.append(b"log", &chunk);
            expected.extend_from_slice(&chunk);
            assert_eq!(entries.value(b"log"), Some(&expected[..]));
        }
        assert!(matches!(entries.find(b"log"), Some(Entry::Shared(_))));
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn get_many_answers_small_large_and_missing_in_order() {
        let mut entries = Entries::default();
        let big = Bytes::from(vec![2u8; SHARE_VALUES_FROM]);
        entries.insert(b"a", Bytes::from_static(b"1"));
        entries.insert(b"big", big.clone());
        entries.insert(b"b", Bytes::from_static(b"22"));
        let keys = ["b", "gone", "big", "a", "b"].map(|k| Bytes::from_static(k.as_bytes()));
        let mut out = vec![Bytes::from_static(b"before")];
        entries.get_many(&keys, &mut out);
        let want: [&[u8]; 6] = [b"before", b"22", b"", &big, b"1", b"22"];
        assert_eq!(out, want);
        assert_eq!(out[3].as_ptr(), big.as_ptr());
    }

    #[test]
    fn counters_are_rewritten_in_place_and_a_failed_update_changes_nothing() {
        let mut entries = Entries::default();
        let add = |entries: &mut Entries, delta: i64| {
            entries.update_counter(b"c", |old| {
                let current: i64 = old.map_or(Ok(0), |v| {
                    std::str::from_utf8(v)
                        .map_err(|_| ())
                        .and_then(|t| t.parse().map_err(|_| ()))
                })?;
                Ok::<_, ()>(current.wrapping_add(delta))
            })
        };
        assert_eq!(add(&mut entries, 5), Ok(5));
        let before = entries.find(b"c").map(|e| e.value().as_ptr());
        assert_eq!(add(&mut entries, 3), Ok(8)); // same length: same allocation
        assert_eq!(entries.find(b"c").map(|e| e.value().as_ptr()), before);
        assert_eq!(add(&mut entries, 2), Ok(10)); // one more digit
        assert_eq!(add(&mut entries, -20), Ok(-10));
        assert_eq!(add(&mut entries, i64::MIN), Ok(i64::MIN.wrapping_add(-10)));
        assert_eq!(
            entries.value(b"c"),
            Some(i64::MAX.wrapping_sub(9).to_string().as_bytes())
        );
        entries.insert(b"c", Bytes::from_static(b"x"));
        assert_eq!(add(&mut entries, 1), Err(()));
        assert_eq!(entries.value(b"c"), Some(&b"x"[..]));
    }

    #[test]
    fn keys_are_compared_whole_not_by_prefix_of_key_and_value() {
        let mut entries = Entries::default();
        entries.insert(b"ab", Bytes::from_static(b"c"));
        entries.insert(b"a", Bytes::from_static(b"bc"));
        assert_eq!(entries.len(), 2);
        assert_eq!(entries.value(b"ab"), Some(&b"c"[..]));
        assert_eq!(entries.value(b"a"), Some(&b"bc"[..]));
        assert!(entries.remove(b"a"));
        assert!(!entries.contains(b"a"));
        assert!(entries.contains(b"ab"));
    }
}
