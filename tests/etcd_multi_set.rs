//! A key repeated in one `multi_set` keeps its last value, as torch's HashStore and TCPStore
//! keep it, through `EtcdStore` and through the etcd-backed server (etcd itself refuses a key
//! twice in one transaction), and a batch still lands in one etcd transaction: every key of
//! it carries the same modification revision.

mod common;

use std::time::Duration;

use common::etcd::EtcdCluster;
use ferrodist::runtime::runtime;
use ferrodist::store::etcd::{EtcdEngine, EtcdStore, Layout};
use ferrodist::store::Store;
use ferrodist::tcp::{Server, ServerConfig, TcpStore, TcpStoreOptions};

fn job() -> String {
    common::etcd::fresh_job("rust-multi-set")
}

fn etcd_store(prefix: &str) -> EtcdStore {
    common::etcd::shared_store(prefix)
}

/// 100 distinct keys in 200 pairs (more than one transaction's 128 puts): each key twice, the
/// second value the one to keep, and one key a third time at the very end.
fn repeated_pairs() -> (Vec<String>, Vec<Vec<u8>>) {
    let mut keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    keys.extend((0..99).map(|i| format!("k{i}")));
    keys.push("k0".into());
    let values = keys
        .iter()
        .enumerate()
        .map(|(n, k)| format!("{k}@{n}").into_bytes())
        .collect();
    (keys, values)
}

/// What applying the pairs in order leaves (torch's stores): each key's last value.
fn in_order(keys: &[String], values: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    let mut last = std::collections::BTreeMap::new();
    for (k, v) in keys.iter().zip(values) {
        last.insert(k.clone(), v.clone());
    }
    last.into_iter().collect()
}

/// The modification revision of each key's etcd key under `prefix`, read with etcd's own client.
fn revisions(prefix: &str, keys: &[&[u8]]) -> Vec<i64> {
    let layout = Layout::new(prefix).expect("a valid prefix");
    runtime().block_on(async {
        let mut client = etcd_client::Client::connect(EtcdCluster::shared_endpoints(), None)
            .await
            .expect("etcd client");
        let mut out = Vec::new();
        for key in keys {
            let found = client.get(layout.value(key), None).await.expect("get");
            out.push(found.kvs()[0].mod_revision());
        }
        out
    })
}

fn assert_last_values_in_one_transaction(store: &dyn Store, prefix: &str, wire: &str) {
    let (keys, values) = repeated_pairs();
    store
        .multi_set(&keys, &values)
        .expect("multi_set with repeated keys");
    let expected = in_order(&keys, &values);
    for (key, value) in &expected {
        assert_eq!(&store.get(key).unwrap(), value, "key {key}");
    }
    assert_eq!(expected[0], ("k0".to_string(), b"k0@199".to_vec()));
    let etcd_keys: Vec<String> = expected.iter().map(|(k, _)| format!("{wire}{k}")).collect();
    let etcd_keys: Vec<&[u8]> = etcd_keys.iter().map(|k| k.as_bytes()).collect();
    let revisions = revisions(prefix, &etcd_keys);
    assert!(
        revisions.iter().all(|&r| r == revisions[0]),
        "100 distinct keys fit one transaction: {revisions:?}"
    );
}

#[test]
fn etcd_store_keeps_the_last_value_of_a_repeated_key() {
    let prefix = job();
    let store = etcd_store(&prefix);
    assert_last_values_in_one_transaction(&store, &prefix, "");
    // The smallest case, and a key repeated with nothing else.
    store
        .multi_set(&["a".into(), "a".into()], &[b"1".to_vec(), b"2".to_vec()])
        .unwrap();
    assert_eq!(store.get("a").unwrap(), b"2");
}

#[test]
fn the_etcd_backed_server_keeps_the_last_value_of_a_repeated_key() {
    let prefix = job();
    let config = ServerConfig {
        host: "127.0.0.1".into(),
        ..ServerConfig::default()
    };
    let server =
        Server::start_with_engine(&config, EtcdEngine::new(etcd_store(&prefix))).expect("starts");
    let client = TcpStore::new(TcpStoreOptions {
        port: server.local_addr().port(),
        timeout: Duration::from_secs(30),
        wait_for_workers: false,
        ..TcpStoreOptions::default()
    })
    .expect("connects");
    // The client sends torch's wire keys, with its leading `/`.
    assert_last_values_in_one_transaction(&client, &prefix, "/");
}
