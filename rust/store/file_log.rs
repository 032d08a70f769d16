//! The record log inside a FileStore file, in torch's exact on-disk format.
//!
//! A FileStore file is an append-only sequence of records, each
//! `u32 key length | key | u32 value length | value` (lengths little-endian, as torch writes
//! them natively on every platform it ships for). A key starting with `-` is a tombstone for the
//! key without the `-`; any other record inserts or overwrites. Keys written by torch and by us
//! are `/` + user key, `-/` + user key, `refcount/` and `cleanup/`.
//!
//! The parser never trusts a length read off disk: every length is checked against the bytes
//! really present before anything is sliced, and nothing is allocated from a length. A file that
//! is not a FileStore log (random bytes, a record cut short) is reported with the offset and the
//! reason, never guessed at.

use std::collections::HashMap;

/// Size of one length field.
const LEN_BYTES: usize = 4;

/// Prefix of a tombstone record's key.
pub const TOMBSTONE: u8 = b'-';

/// Prefix of a user key inside the file.
pub const USER_PREFIX: char = '/';

/// Internal key counting live FileStore instances.
pub const REFCOUNT_KEY: &str = "refcount/";

/// Internal key counting FileStore instances destroyed so far.
pub const CLEANUP_KEY: &str = "cleanup/";

/// One decoded record, borrowing from the bytes it was parsed from.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record key as stored (with its `/`, `-` or internal spelling).
    pub key: &'a [u8],
    /// The value bytes.
    pub value: &'a [u8],
}

/// Why a byte range is not a sequence of whole, valid records.
#[derive(Debug, PartialEq, Eq)]
pub enum LogError {
    /// The bytes end inside a record: a field needs `needed` bytes but only `available` remain.
    Truncated {
        /// Offset (from the start of the parsed range) of the record that is cut short.
        at: usize,
        /// What the record claims it needs from `at`.
        needed: u64,
        /// What is really there from `at`.
        available: usize,
    },
    /// A record whose key no FileStore writes (not `/…`, `-…`, `refcount/`, `cleanup/`).
    UnknownKey {
        /// Offset of the record.
        at: usize,
    },
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::Truncated {
                at,
                needed,
                available,
            } => write!(
                f,
                "record at byte {at} needs {needed} bytes but only {available} remain \
                 (a truncated record, or not a FileStore file)"
            ),
            LogError::UnknownKey { at } => write!(
                f,
                "record at byte {at} has a key no FileStore writes (not a FileStore file?)"
            ),
        }
    }
}

/// True for a record key torch's or our FileStore can have written.
fn known_key(key: &[u8]) -> bool {
    matches!(key.first(), Some(b'/') | Some(&TOMBSTONE))
        || key == REFCOUNT_KEY.as_bytes()
        || key == CLEANUP_KEY.as_bytes()
}

/// Reads the length field at `pos`, checking it fits in `bytes` (from record start `at`).
fn read_len(bytes: &[u8], pos: usize, at: usize) -> Result<usize, LogError> {
    let field = bytes.get(pos..pos + LEN_BYTES).ok_or(LogError::Truncated {
        at,
        needed: (pos + LEN_BYTES - at) as u64,
        available: bytes.len() - at,
    })?;
    let len = u32::from_le_bytes(field.try_into().expect("four bytes")) as usize;
    let end = pos + LEN_BYTES;
    if len > bytes.len() - end {
        return Err(LogError::Truncated {
            at,
            needed: (end - at) as u64 + len as u64,
            available: bytes.len() - at,
        });
    }
    Ok(len)
}

/// Parses one record starting at `at`; returns it and the offset just past it.
pub fn parse_record(bytes: &[u8], at: usize) -> Result<(Record<'_>, usize), LogError> {
    let key_len = read_len(bytes, at, at)?;
    let key_start = at + LEN_BYTES;
    let key = &bytes[key_start..key_start + key_len];
    if !known_key(key) {
        return Err(LogError::UnknownKey { at });
    }
    let value_len = read_len(bytes, key_start + key_len, at)?;
    let value_start = key_start + key_len + LEN_BYTES;
    let value = &bytes[value_start..value_start + value_len];
    Ok((Record { key, value }, value_start + value_len))
}

/// Parses every record of `bytes` (which must end on a record boundary).
pub fn parse_all(bytes: &[u8]) -> Result<Vec<Record<'_>>, LogError> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (record, next) = parse_record(bytes, at)?;
        records.push(record);
        at = next;
    }
    Ok(records)
}

/// Applies `bytes` (whole records) to `map`, torch's replay rule: a `-` key deletes the key
/// without the `-`, anything else inserts or overwrites. Keys are kept as stored (`/k`).
pub fn replay(bytes: &[u8], map: &mut HashMap<String, Vec<u8>>) -> Result<(), LogError> {
    for record in parse_all(bytes)? {
        let key = String::from_utf8_lossy(record.key);
        match key.strip_prefix(TOMBSTONE as char) {
            Some(deleted) => {
                map.remove(deleted);
            }
            None => {
                map.insert(key.into_owned(), record.value.to_vec());
            }
        }
    }
    Ok(())
}

/// Encodes one record in torch's format into `out`. Fails (returns false) when the key or the
/// value does not fit a `u32` length; torch would silently corrupt the file there.
pub fn encode_record(key: &[u8], value: &[u8], out: &mut Vec<u8>) -> bool {
    let (Ok(key_len), Ok(value_len)) = (u32::try_from(key.len()), u32::try_from(value.len()))
    else {
        return false;
    };
    out.reserve(2 * LEN_BYTES + key.len() + value.len());
    out.extend_from_slice(&key_len.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&value_len.to_le_bytes());
    out.extend_from_slice(value);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(records: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in records {
            assert!(encode_record(k, v, &mut out));
        }
        out
    }

    fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            "[a-z0-9/]{0,12}".prop_map(|k| format!("/{k}").into_bytes()),
            "[a-z0-9/]{0,12}".prop_map(|k| format!("-/{k}").into_bytes()),
            Just(REFCOUNT_KEY.as_bytes().to_vec()),
            Just(CLEANUP_KEY.as_bytes().to_vec()),
        ]
    }

    #[test]
    fn matches_the_bytes_torch_writes() {
        // Bytes written by torch 2.13's FileStore for `FileStore(p)` then `set("a", "abc")`.
        let torch =
            b"\x09\x00\x00\x00refcount/\x01\x00\x00\x001\x02\x00\x00\x00/a\x03\x00\x00\x00abc";
        let ours = encode(&[
            (b"refcount/".to_vec(), b"1".to_vec()),
            (b"/a".to_vec(), b"abc".to_vec()),
        ]);
        assert_eq!(&ours[..], &torch[..]);
    }

    #[test]
    fn tombstones_delete_and_later_writes_win() {
        let bytes = encode(&[
            (b"/a".to_vec(), b"1".to_vec()),
            (b"/b".to_vec(), b"2".to_vec()),
            (b"-/a".to_vec(), Vec::new()),
            (b"/b".to_vec(), b"3".to_vec()),
        ]);
        let mut map = HashMap::new();
        replay(&bytes, &mut map).unwrap();
        assert_eq!(map.len(), 1);
        assert_eq!(map["/b"], b"3");
    }

    #[test]
    fn huge_length_is_reported_not_allocated() {
        let bytes = [0xff, 0xff, 0xff, 0xff, b'/'];
        let err = parse_all(&bytes).unwrap_err();
        assert_eq!(
            err,
            LogError::Truncated {
                at: 0,
                needed: 4 + u32::MAX as u64,
                available: 5
            }
        );
    }

    #[test]
    fn unknown_key_is_rejected() {
        let bytes = encode(&[(b"xyz".to_vec(), b"1".to_vec())]);
        assert_eq!(
            parse_all(&bytes).unwrap_err(),
            LogError::UnknownKey { at: 0 }
        );
    }

    proptest! {
        #[test]
        fn encode_then_parse_round_trips(
            records in proptest::collection::vec(
                (key_strategy(), proptest::collection::vec(any::<u8>(), 0..40)), 0..20)
        ) {
            let bytes = encode(&records);
            let parsed = parse_all(&bytes).unwrap();
            prop_assert_eq!(parsed.len(), records.len());
            for (got, (k, v)) in parsed.iter().zip(&records) {
                prop_assert_eq!(got.key, &k[..]);
                prop_assert_eq!(got.value, &v[..]);
            }
        }

        #[test]
        fn every_cut_inside_a_record_is_truncated(
            records in proptest::collection::vec(
                (key_strategy(), proptest::collection::vec(any::<u8>(), 0..40)), 1..8),
            cut in any::<proptest::sample::Index>(),
        ) {
            let bytes = encode(&records);
            let boundaries: Vec<usize> = {
                let mut at = 0;
                let mut b = vec![0];
                for (k, v) in &records { at += 8 + k.len() + v.len(); b.push(at); }
                b
            };
            let cut = cut.index(bytes.len());
            let result = parse_all(&bytes[..cut]);
            if boundaries.contains(&cut) {
                prop_assert!(result.is_ok());
            } else {
                let is_truncated = matches!(result, Err(LogError::Truncated { .. }));
                prop_assert!(is_truncated);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut map = HashMap::new();
            let _ = replay(&bytes, &mut map);
        }
    }
}
