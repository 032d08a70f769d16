//! Where a job's data lives in etcd's one flat keyspace, and why no job can reach another's.
//!
//! Everything of job `<prefix>` sits under `<prefix>:`, so one range delete removes a finished
//! job ([`super::EtcdStore::purge`]) and nothing else. Under it three namespaces, because torch's
//! stores keep queues apart from keys (a queue and a key may share a name, `delete_key` leaves
//! the queue alone, `num_keys` and `list_keys` skip queues):
//!
//! * `<prefix>:kv/<key>`: a key's value, raw bytes (counters as decimal ASCII, as torch's);
//! * `<prefix>:queue/<key>`: a whole queue in one etcd key (see [`super::queue`]); it exists
//!   only while the queue is non-empty, so "present" is one lookup for `check` and `wait`;
//! * `<prefix>:receipt/<client>/<slot>`: what a store handle's last read-modify-write in that
//!   slot returned (see [`super::rmw`]); never user-visible.
//! * `<prefix>:roll/<len>/<roll>/<member>`: a rendezvous's arrivals, a key per member (see
//!   [`super::roll`]); never user-visible.
//!
//! Why `:` ends the prefix: a prefix is made of segments of `[A-Za-z0-9._-]` joined by single
//! `/` ([`check_prefix`]), so it never holds a `:`. The first `:` of any etcd key written here is
//! therefore where its job's prefix ends, which makes jobs disjoint whatever their names and
//! whatever their user keys: job `a`'s range `a:` holds none of job `a/b`'s keys (`a/b:`) nor
//! of job `ab`'s (`ab:`), and job `a/kv`'s `k` (`a/kv:kv/k`) is not job `a`'s `kv/k`
//! (`a:kv/kv/k`). With `/` as the end (the layout before), a prefix could continue past it: `a`'s
//! purge deleted all of `a/b`, and those two keys were one etcd key. `/` stays usable inside a
//! prefix, so an operator can still grant etcd roles by a parent path (`team/`).

use crate::error::{Error, Result};

/// What ends a job prefix in every etcd key; never a byte of a valid prefix.
const END: char = ':';

/// Longest job prefix, in bytes: room for a path of run ids, far below etcd's key limits.
pub const MAX_PREFIX_LEN: usize = 255;

/// Refuses a job prefix that could be empty, odd, or read as part of another's.
///
/// A valid one is one or more segments of ASCII letters, digits, `.`, `_` and `-`, joined by
/// single `/`: no leading, trailing or doubled `/`, no `.` or `..` segment, at most
/// [`MAX_PREFIX_LEN`] bytes. The error names the `prefix` argument and shows the value escaped.
pub fn check_prefix(prefix: &str) -> Result<()> {
    let why = if prefix.is_empty() {
        Some("must not be empty (name the job)")
    } else if prefix.len() > MAX_PREFIX_LEN {
        Some("is too long (at most 255 bytes)")
    } else if prefix.starts_with('/') || prefix.ends_with('/') || prefix.contains("//") {
        Some("must not start or end with '/' nor hold '//'")
    } else if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
    {
        Some("may hold only ASCII letters, digits, '.', '_', '-' and '/'")
    } else if prefix.split('/').any(|s| s == "." || s == "..") {
        Some("must not have a '.' or '..' segment")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::InvalidArgument(format!(
            "EtcdStore: argument 'prefix' (the job's etcd prefix) {why}; want segments of \
             letters, digits, '.', '_' and '-' joined by single '/', got {:?}",
            shown(prefix)
        ))),
    }
}

/// `prefix` cut to a length a message can carry.
fn shown(prefix: &str) -> String {
    match prefix.char_indices().nth(64) {
        None => prefix.to_owned(),
        Some((cut, _)) => format!("{}...", &prefix[..cut]),
    }
}

/// The etcd key names of one job.
#[derive(Debug, Clone)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    /// The layout of job `prefix`, once [`check_prefix`] accepts it.
    pub fn new(prefix: &str) -> Result<Self> {
        check_prefix(prefix)?;
        Ok(Layout {
            prefix: prefix.to_owned(),
        })
    }

    /// The job prefix as given.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Everything of the job, and nothing of any other job (a range by prefix): `<prefix>:`.
    pub fn job(&self) -> Vec<u8> {
        format!("{}{END}", self.prefix).into_bytes()
    }

    /// Every key's value (a range by prefix).
    pub fn values(&self) -> Vec<u8> {
        self.under("kv/", b"")
    }

    /// The etcd key holding `key`'s value (a user key, or a raw wire key of any bytes).
    pub fn value(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        self.under("kv/", key.as_ref())
    }

    /// The etcd key holding the queue named `key`.
    pub fn queue(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        self.under("queue/", key.as_ref())
    }

    /// `<prefix>:<namespace><key>`.
    fn under(&self, namespace: &str, key: &[u8]) -> Vec<u8> {
        let mut etcd_key = self.job();
        etcd_key.reserve(namespace.len() + key.len());
        etcd_key.extend_from_slice(namespace.as_bytes());
        etcd_key.extend_from_slice(key);
        etcd_key
    }

    /// The etcd key of receipt `slot` of store handle `client`.
    pub fn receipt(&self, client: &str, slot: usize) -> Vec<u8> {
        self.under("receipt/", format!("{client}/{slot}").as_bytes())
    }

    /// The range of roll `roll`'s member keys (its name's length first, so one roll's range
    /// never covers another's: roll `a` would otherwise hold roll `a/b`'s keys).
    pub fn roll(&self, roll: &str) -> Vec<u8> {
        self.under("roll/", format!("{}/{roll}/", roll.len()).as_bytes())
    }

    /// The user's key from an etcd key under [`Layout::values`].
    pub fn user_key(&self, etcd_key: &[u8]) -> Option<String> {
        String::from_utf8(self.raw_key(etcd_key)?.to_vec()).ok()
    }

    /// The key's bytes from an etcd key under [`Layout::values`] (a raw wire key).
    pub fn raw_key<'k>(&self, etcd_key: &'k [u8]) -> Option<&'k [u8]> {
        etcd_key.strip_prefix(self.values().as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(prefix: &str) -> Layout {
        Layout::new(prefix).expect("a valid prefix")
    }

    #[test]
    fn queues_and_values_of_one_name_are_different_etcd_keys() {
        let layout = layout("job");
        assert_eq!(layout.value("a"), b"job:kv/a");
        assert_eq!(layout.queue("a"), b"job:queue/a");
        assert_eq!(layout.user_key(b"job:kv/a/b").as_deref(), Some("a/b"));
        assert_eq!(layout.user_key(b"job:queue/a"), None);
        assert!(layout.receipt("c1", 3).starts_with(&layout.job()));
        assert!(layout.roll("r").starts_with(&layout.job()));
    }

    #[test]
    fn prefixes_that_are_empty_odd_or_could_nest_are_refused_naming_the_argument() {
        for bad in [
            "", "/", "/a", "a/", "a//b", "a:b", "a b", "a\0", "a\n", "ä", "a/../b", ".", "..",
            "a/.", "*", "a\\b",
        ] {
            match Layout::new(bad) {
                Err(Error::InvalidArgument(why)) => assert!(why.contains("'prefix'"), "{why}"),
                other => panic!("prefix {bad:?} accepted: {other:?}"),
            }
        }
        assert!(Layout::new(&"x".repeat(MAX_PREFIX_LEN + 1)).is_err());
        for good in [
            "a",
            "job-42",
            "team/run.7/x_y",
            "A1",
            &"x".repeat(MAX_PREFIX_LEN),
        ] {
            assert_eq!(layout(good).prefix(), good);
        }
    }

    #[test]
    fn no_job_range_holds_another_jobs_key_whatever_the_names() {
        let names = ["a", "ab", "a/b", "a/kv", "a/b/c", "kv", "a.b", "a-b", "a_b"];
        let keys: [&[u8]; 7] = [b"", b"k", b"kv/k", b"/", b"../", b":", b"b:kv/k"];
        for one in names {
            for other in names.iter().filter(|&&o| o != one) {
                let (one, other) = (layout(one), layout(other));
                assert!(
                    !other.job().starts_with(&one.job()),
                    "{one:?} holds {other:?}"
                );
                for key in keys {
                    for etcd_key in [other.value(key), other.queue(key), other.roll("r")] {
                        assert!(!etcd_key.starts_with(&one.job()), "{one:?} {etcd_key:?}");
                    }
                    for mine in keys {
                        assert_ne!(one.value(mine), other.value(key));
                    }
                }
            }
        }
        // The case the old layout merged: job `a/kv`'s `k` and job `a`'s `kv/k`.
        assert_ne!(layout("a/kv").value("k"), layout("a").value("kv/k"));
    }
}
