//! Jobs on one etcd cluster cannot touch each other (issue 27, items 4 and 11): job prefixes
//! are checked, no job's range holds another's keys (`a` and `a/b`, `a` and `ab`, `a/kv` + `k`
//! and `a` + `kv/k`), `purge` removes one job only, and a scripted client of another job tries
//! every store call, plain and wire, with tricky keys against a victim's keys and changes none.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::etcd::{fresh_job, shared_store, EtcdCluster};
use ferrodist::error::Error;
use ferrodist::runtime::runtime;
use ferrodist::store::etcd::{EtcdOptions, EtcdStore, Layout};
use ferrodist::store::{Roll, Store};

/// Every etcd key of job `prefix` with its value and modification revision, read with etcd's
/// own client (a write of any kind changes a revision).
fn raw_job(prefix: &str) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    let range = Layout::new(prefix).expect("a valid prefix").job();
    runtime().block_on(async {
        let mut client = etcd_client::Client::connect(EtcdCluster::shared_endpoints(), None)
            .await
            .expect("etcd client");
        let options = etcd_client::GetOptions::new().with_prefix();
        let found = client.get(range, Some(options)).await.expect("range read");
        found
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect()
    })
}

/// A job with a value, a counter, a queue, a roll and a receipt (from the `add`).
fn populated(prefix: &str) -> EtcdStore {
    let store = shared_store(prefix);
    store.set("k", prefix.as_bytes()).unwrap();
    store.set("kv/k", b"nested-looking").unwrap();
    store.set("/torch/wire", b"w").unwrap();
    store.add("n", 7).unwrap();
    store.queue_push("q", b"x").unwrap();
    store.enroll("roll", 0).unwrap();
    store
}

#[test]
fn prefixes_that_are_empty_odd_or_could_nest_are_refused_before_connecting() {
    for bad in [
        "", "/", "a/", "/a", "a//b", "a:b", "a b", "..", "a/../b", "ä",
    ] {
        let options = EtcdOptions {
            // Nothing listens here: a prefix checked after connecting would fail otherwise.
            endpoints: vec!["127.0.0.1:1".into()],
            prefix: bad.into(),
            timeout: Duration::from_secs(10),
            user: None,
            tls: None,
        };
        match EtcdStore::connect(&options) {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("'prefix'"), "{why}"),
            Err(other) => panic!("prefix {bad:?}: {other}"),
            Ok(_) => panic!("prefix {bad:?} accepted"),
        }
    }
}

#[test]
fn purging_a_job_leaves_jobs_whose_names_extend_it_whole() {
    let root = fresh_job("nest");
    let job = format!("{root}/a");
    let others = [
        format!("{job}/b"),
        format!("{root}/ab"),
        format!("{job}/kv"),
    ];
    let _victims: Vec<EtcdStore> = others.iter().map(|p| populated(p)).collect();
    let before: Vec<_> = others.iter().map(|p| raw_job(p)).collect();
    assert!(before.iter().all(|keys| keys.len() >= 6), "{before:?}");
    let purged = populated(&job);
    let own = raw_job(&job).len();
    assert_eq!(
        purged.purge().unwrap(),
        own as i64,
        "purge counts exactly the job's keys"
    );
    assert!(raw_job(&job).is_empty());
    let after: Vec<_> = others.iter().map(|p| raw_job(p)).collect();
    assert_eq!(before, after, "purging {job} touched another job");
}

#[test]
fn a_key_of_one_job_is_never_a_key_of_another() {
    let root = fresh_job("alias");
    let (outer, inner) = (
        shared_store(&format!("{root}/a")),
        shared_store(&format!("{root}/a/kv")),
    );
    inner.set("k", b"inner").unwrap();
    outer.set("kv/k", b"outer").unwrap();
    assert_eq!(inner.get("k").unwrap(), b"inner");
    assert_eq!(outer.get("kv/k").unwrap(), b"outer");
    assert_eq!(inner.list_keys().unwrap(), ["k"]);
    assert_eq!(outer.list_keys().unwrap(), ["kv/k"]);
    assert!(!outer.check(&["k".into()]).unwrap());
    outer.purge().unwrap();
    assert_eq!(inner.get("k").unwrap(), b"inner");
    inner.purge().unwrap();
}

/// Keys an attacker might hope escape its own job: empty, separators, parent references, the
/// victim's etcd names, layout delimiters, a NUL, and one far longer than any name.
fn tricky_keys(victim: &str) -> Vec<String> {
    let mut keys: Vec<String> = [
        "", "/", "//", "../", "..", ":", "k", "kv/k", "q", "n", "../k", "../../k", "..\\k", "\0",
    ]
    .map(String::from)
    .to_vec();
    let tail = victim.rsplit('/').next().unwrap_or(victim);
    for name in [
        format!("../{tail}:kv/k"),
        format!("{victim}:kv/k"),
        String::from(":kv/k"),
        format!("/../{tail}/kv/k"),
    ] {
        keys.push(name);
    }
    keys.push("x".repeat(64 * 1024));
    keys
}

/// What a client of `attacker` does to reach the victim's keys: every call of the store, with
/// every tricky key, then a purge.
fn attack(attacker: &EtcdStore, victim: &str) {
    let short = Duration::from_millis(50);
    let keys = tricky_keys(victim);
    // Before it writes anything, the attacker sees nothing at all.
    assert_eq!(attacker.num_keys().unwrap(), 0);
    assert!(attacker.list_keys().unwrap().is_empty());
    for key in &keys {
        let one = [key.clone()];
        assert!(!attacker.check(&one).unwrap(), "{key:?} visible");
        assert!(attacker.get_timeout(key, short).unwrap_err().is_timeout());
        assert!(attacker.wait(&one, Some(short)).is_err());
        assert_eq!(attacker.queue_len(key).unwrap(), 0);
        assert!(matches!(
            attacker.queue_pop(key, false),
            Err(Error::QueueEmpty)
        ));
        assert!(!attacker.delete_key(key).unwrap());
    }
    attacker.set_timeout(short);
    assert!(attacker.multi_get(&keys[..3]).unwrap_err().is_timeout());
    attacker.set_timeout(Duration::from_secs(10));
    // Then it writes, counts, swaps, appends, pushes, pops and deletes with the same keys.
    for key in &keys {
        attacker.set(key, b"attacker").unwrap();
        assert_eq!(attacker.get(key).unwrap(), b"attacker");
        attacker.compare_set(key, b"attacker", b"swapped").unwrap();
        attacker.append(key, b"+").unwrap();
        assert!(attacker.delete_key(key).unwrap());
        assert_eq!(attacker.add(key, 1).unwrap(), 1);
        attacker.queue_push(key, b"p").unwrap();
        assert_eq!(attacker.queue_pop(key, false).unwrap(), b"p");
        attacker.enroll(key, 1).unwrap();
    }
    let values = vec![b"m".to_vec(); keys.len()];
    attacker.multi_set(&keys, &values).unwrap();
    assert_eq!(attacker.multi_get(&keys).unwrap(), values);
    let mut listed = attacker.list_keys().unwrap();
    listed.sort();
    let mut mine = keys.clone();
    mine.sort();
    assert_eq!(listed, mine, "the attacker lists only its own keys");
    // The wire calls a `ferrodist-store --backend etcd://` serves, on the same keys.
    runtime().block_on(async {
        for key in &keys {
            let wire = Bytes::copy_from_slice(key.as_bytes());
            attacker.wire_set(&wire, b"wire").await.unwrap();
            assert_eq!(attacker.wire_get(&wire).await.unwrap(), "wire");
            attacker.wire_add(&wire, 0).await.unwrap_err();
            attacker.wire_append(&wire, b"!").await.unwrap();
            attacker.wire_delete_key(&wire).await.unwrap();
            attacker.wire_queue_push(&wire, b"p").await.unwrap();
            attacker.wire_queue_pop(&wire).await.unwrap();
        }
        let listed = attacker.wire_list_keys().await.unwrap();
        assert!(listed
            .iter()
            .all(|k| keys.iter().any(|m| m.as_bytes() == k)));
    });
    assert!(attacker.purge().unwrap() > 0);
    assert_eq!(attacker.num_keys().unwrap(), 0);
}

#[test]
fn a_client_of_another_job_cannot_read_write_list_delete_or_purge_a_victims_keys() {
    let root = fresh_job("attack");
    let victim_prefix = format!("{root}/victim");
    let victim = populated(&victim_prefix);
    let before = raw_job(&victim_prefix);
    // The attacker's own prefix is the victim's parent, child, sibling-by-name, or one that
    // ends in a layout word.
    let attackers = [
        root.clone(),
        format!("{victim_prefix}/x"),
        format!("{victim_prefix}x"),
        format!("{victim_prefix}/kv"),
        format!("{victim_prefix}/queue"),
        format!("{root}/victim.kv"),
    ];
    for prefix in &attackers {
        attack(&shared_store(prefix), &victim_prefix);
        assert_eq!(
            raw_job(&victim_prefix),
            before,
            "a client of job {prefix:?} changed the victim's keys"
        );
    }
    assert_eq!(victim.get("k").unwrap(), victim_prefix.as_bytes());
    assert_eq!(victim.queue_len("q").unwrap(), 1);
    victim.purge().unwrap();
}
