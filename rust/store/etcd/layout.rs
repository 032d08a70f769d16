//! Where a job's data lives in etcd's one flat keyspace.
//!
//! Everything of one job sits under `<prefix>/`, so one range delete removes a finished job
//! ([`super::EtcdStore::purge`]) and jobs with different prefixes never see each other. Under it
//! three namespaces, because torch's stores keep queues apart from keys (a queue and a key may
//! share a name, `delete_key` leaves the queue alone, `num_keys` and `list_keys` skip queues):
//!
//! * `<prefix>/kv/<key>`: a key's value, raw bytes (counters as decimal ASCII, as torch's);
//! * `<prefix>/queue/<key>`: a whole queue in one etcd key (see [`super::queue`]); it exists
//!   only while the queue is non-empty, so "present" is one lookup for `check` and `wait`;
//! * `<prefix>/receipt/<client>/<slot>`: what a store handle's last read-modify-write in that
//!   slot returned (see [`super::rmw`]); never user-visible.
//! * `<prefix>/roll/<len>/<roll>/<member>`: a rendezvous's arrivals, a key per member (see
//!   [`super::roll`]); never user-visible.

/// The etcd key names of one job.
#[derive(Debug, Clone)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    /// The layout under `prefix` (a trailing `/` is dropped; empty means the keyspace root).
    pub fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// The job prefix as given, without its trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Everything of the job (a range by prefix).
    pub fn job(&self) -> Vec<u8> {
        format!("{}/", self.prefix).into_bytes()
    }

    /// Every key's value (a range by prefix).
    pub fn values(&self) -> Vec<u8> {
        format!("{}/kv/", self.prefix).into_bytes()
    }

    /// The etcd key holding `key`'s value (a user key, or a raw wire key of any bytes).
    pub fn value(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        self.under("/kv/", key.as_ref())
    }

    /// The etcd key holding the queue named `key`.
    pub fn queue(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        self.under("/queue/", key.as_ref())
    }

    /// `<prefix><namespace><key>`.
    fn under(&self, namespace: &str, key: &[u8]) -> Vec<u8> {
        let mut etcd_key = Vec::with_capacity(self.prefix.len() + namespace.len() + key.len());
        etcd_key.extend_from_slice(self.prefix.as_bytes());
        etcd_key.extend_from_slice(namespace.as_bytes());
        etcd_key.extend_from_slice(key);
        etcd_key
    }

    /// The etcd key of receipt `slot` of store handle `client`.
    pub fn receipt(&self, client: &str, slot: usize) -> Vec<u8> {
        format!("{}/receipt/{client}/{slot}", self.prefix).into_bytes()
    }

    /// The user's key from an etcd key under [`Layout::values`].
    pub fn user_key(&self, etcd_key: &[u8]) -> Option<String> {
        String::from_utf8(self.raw_key(etcd_key)?.to_vec()).ok()
    }

    /// The key's bytes from an etcd key under [`Layout::values`] (a raw wire key).
    pub fn raw_key<'k>(&self, etcd_key: &'k [u8]) -> Option<&'k [u8]> {
        etcd_key
            .strip_prefix(self.prefix.as_bytes())?
            .strip_prefix(b"/kv/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_and_values_of_one_name_are_different_etcd_keys() {
        let layout = Layout::new("job/");
        assert_eq!(layout.value("a"), b"job/kv/a");
        assert_eq!(layout.queue("a"), b"job/queue/a");
        assert_eq!(layout.user_key(b"job/kv/a/b").as_deref(), Some("a/b"));
        assert_eq!(layout.user_key(b"job/queue/a"), None);
        assert!(layout.receipt("c1", 3).starts_with(&layout.job()));
    }
}
