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

    /// The etcd key holding `key`'s value.
    pub fn value(&self, key: &str) -> Vec<u8> {
        format!("{}/kv/{key}", self.prefix).into_bytes()
    }

    /// The etcd key holding the queue named `key`.
    pub fn queue(&self, key: &str) -> Vec<u8> {
        format!("{}/queue/{key}", self.prefix).into_bytes()
    }

    /// The etcd key of receipt `slot` of store handle `client`.
    pub fn receipt(&self, client: &str, slot: usize) -> Vec<u8> {
        format!("{}/receipt/{client}/{slot}", self.prefix).into_bytes()
    }

    /// The user's key from an etcd key under [`Layout::values`].
    pub fn user_key(&self, etcd_key: &[u8]) -> Option<String> {
        let rest = etcd_key.strip_prefix(self.values().as_slice())?;
        String::from_utf8(rest.to_vec()).ok()
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
