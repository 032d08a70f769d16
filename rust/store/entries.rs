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

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::io::Write;

use bytes::{Bytes, BytesMut};

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

// The map hashes and compares entries by key alone, so it can be searched with a `&[u8]`.
impl Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Entry {}

/// Keys and their values.
#[derive(Default)]
pub struct Entries {
    set: HashSet<Entry>,
}

impl Entries {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True if `key` has a value.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.set.contains(key)
    }

    /// The value of `key`, borrowed.
    pub fn value(&self, key: &[u8]) -> Option<&[u8]> {
        self.set.get(key).map(Entry::value)
    }

    /// The value of `key`, owned: large values are shared, small ones copied.
    pub fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.set.get(key).map(Entry::value_bytes)
    }

    /// Appends the value of each of `keys` to `out` (empty for a missing key). Small values are
    /// copied into one buffer that their `Bytes` share: one allocation for the lot, not one per
    /// value, which is what keeps a MULTI_GET's time under the store's lock short.
    pub fn get_many(&self, keys: &[Bytes], out: &mut Vec<Bytes>) {
        let found: Vec<Option<&Entry>> = keys.iter().map(|k| self.set.get(&k[..])).collect();
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
        self.set.replace(Entry::new(key, value));
    }

    /// Sets `key` to a copy of `value`.
    pub fn insert_slice(&mut self, key: &[u8], value: &[u8]) {
        if value.len() < SHARE_VALUES_FROM {
            if let Ok(key_len) = u32::try_from(key.len()) {
                self.set.replace(Entry::packed(key, key_len, value));
                return;
            }
        }
        self.insert(key, Bytes::copy_from_slice(value));
    }

    /// Sets `key` to the integer `next(old value)` gives, in ASCII digits (ADD's counter). A
    /// packed entry whose digits keep their length is rewritten in place, with no allocation;
    /// when `next` fails, nothing changes.
    pub fn update_counter<E>(
        &mut self,
        key: &[u8],
        next: impl FnOnce(Option<&[u8]>) -> Result<i64, E>,
    ) -> Result<i64, E> {
        let old = self.set.take(key);
        let sum = match next(old.as_ref().map(Entry::value)) {
            Ok(sum) => sum,
            Err(err) => {
                if let Some(entry) = old {
                    self.set.insert(entry);
                }
                return Err(err);
            }
        };
        let mut buf = [0u8; 20]; // i64::MIN has 20 characters
        let digits = {
            let mut rest = &mut buf[..];
            write!(rest, "{sum}").expect("an i64 fits in 20 bytes");
            let written = 20 - rest.len();
            &buf[..written]
        };
        match old {
            Some(Entry::Packed { mut bytes, key_len })
                if bytes.len() - key_len as usize == digits.len() =>
            {
                bytes[key_len as usize..].copy_from_slice(digits);
                self.set.insert(Entry::Packed { bytes, key_len });
            }
            _ => self.insert_slice(key, digits),
        }
        Ok(sum)
    }

    /// Removes `key`; true if it had a value.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        self.set.remove(key)
    }

    /// Appends `data` to the value of `key` (an empty value when missing). A value that has
    /// grown large is extended in place when nothing else holds it (no reply still being
    /// written), so a run of appends costs O(bytes) in all, not a copy of the value per append.
    pub fn append(&mut self, key: &[u8], data: &[u8]) {
        let value = match self.set.take(key) {
            None => return self.insert_slice(key, data),
            Some(Entry::Packed { bytes, key_len }) => {
                let old = &bytes[key_len as usize..];
                if old.len() + data.len() < SHARE_VALUES_FROM {
                    let mut grown = Vec::with_capacity(bytes.len() + data.len());
                    grown.extend_from_slice(&bytes);
                    grown.extend_from_slice(data);
                    self.set.insert(Entry::Packed {
                        bytes: grown.into_boxed_slice(),
                        key_len,
                    });
                    return;
                }
                BytesMut::from(old)
            }
            Some(Entry::Shared(entry)) => match entry.value.try_into_mut() {
                Ok(unique) => unique,
                Err(shared) => BytesMut::from(shared.as_ref()),
            },
        };
        let mut value = value;
        value.extend_from_slice(data);
        self.insert(key, value.freeze());
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.set.iter().map(Entry::key)
    }

    /// Every key with its value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.set.iter().map(|e| (e.key(), e.value()))
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
        assert!(matches!(
            entries.set.get(&b"/key"[..]),
            Some(Entry::Packed { .. })
        ));
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
        assert!(matches!(
            entries.set.get(&b"log"[..]),
            Some(Entry::Shared(_))
        ));
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
        let before = entries.set.get(&b"c"[..]).map(|e| e.value().as_ptr());
        assert_eq!(add(&mut entries, 3), Ok(8)); // same length: same allocation
        assert_eq!(
            entries.set.get(&b"c"[..]).map(|e| e.value().as_ptr()),
            before
        );
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
