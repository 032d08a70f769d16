//! A rendezvous over EtcdStore against a real 3-member etcd cluster: the roll (a key per rank,
//! counted in the same transaction) counts each rank once and tells exactly one rank it is last,
//! a join names the ranks that never came, and an interrupt ends a wait promptly while the
//! wait's one watch stays armed until then.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::etcd::EtcdCluster;
use ferrodist::error::Error;
use ferrodist::rendezvous::{enroll, Join};
use ferrodist::store::etcd::{EtcdOptions, EtcdStore};
use ferrodist::store::{blocking, PrefixStore, Roll, Store};

static JOBS: AtomicUsize = AtomicUsize::new(0);

fn store() -> EtcdStore {
    let prefix = format!(
        "rust-rdzv-{}-{}",
        std::process::id(),
        JOBS.fetch_add(1, Ordering::Relaxed)
    );
    let options = EtcdOptions {
        endpoints: EtcdCluster::shared_endpoints(),
        prefix,
        timeout: Duration::from_secs(20),
        user: None,
        tls: None,
    };
    EtcdStore::connect(&options).expect("connects")
}

#[test]
fn a_roll_counts_each_member_once_and_in_commit_order() {
    let s = store();
    let ranks = 64;
    let counts: Vec<usize> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let own = s.clone_store().unwrap();
                scope.spawn(move || enroll(&*own, "r/", rank).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = counts.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=ranks).collect::<Vec<_>>(), "1..n, once each");
    let members: HashSet<usize> = s.enrolled("r/").unwrap().into_iter().collect();
    assert_eq!(members, (0..ranks).collect());
    // A member enrolling again (a retried call) is not counted twice.
    assert_eq!(s.enroll("r/", 5).unwrap(), ranks);
    assert_eq!(s.enrolled("r/").unwrap().len(), ranks);
    // No shared key: the roll's keys are not the user's.
    assert_eq!(s.num_keys().unwrap(), 0);
}

#[test]
fn rolls_whose_names_nest_are_apart() {
    let s = store();
    s.enroll("a", 0).unwrap();
    s.enroll("a/1", 7).unwrap();
    assert_eq!(s.enroll("a", 1).unwrap(), 2);
    assert_eq!(s.enrolled("a/1").unwrap(), vec![7]);
    let view = PrefixStore::new("pg", s.clone_store().unwrap());
    assert_eq!(
        view.enroll("a", 0).unwrap(),
        1,
        "a prefix view has rolls of its own"
    );
}

#[test]
fn a_join_completes_on_the_last_rank_and_names_the_missing_ones_on_timeout() {
    let s: Arc<dyn Store> = Arc::new(store());
    let timeout = Duration::from_millis(1500);
    let (first, done) = Join::arrive(s.clone(), "ok/", 1, 2, timeout).unwrap();
    assert!(!done);
    let (_, done) = Join::arrive(s.clone(), "ok/", 0, 2, timeout).unwrap();
    assert!(done, "the rank that completes the roll knows it");
    assert_eq!(first.wait(timeout, &mut || Ok(())).unwrap(), None);

    let (join, _) = Join::arrive(s.clone(), "dead/", 2, 4, timeout).unwrap();
    Join::arrive(s.clone(), "dead/", 0, 4, timeout).unwrap();
    let err = loop {
        match join.wait(Duration::from_millis(300), &mut || Ok(())) {
            Ok(Some(progress)) => assert_eq!(progress.missing, vec![1, 3]),
            Ok(None) => panic!("ranks 1 and 3 never came"),
            Err(err) => break err,
        }
    };
    assert!(err.is_timeout(), "{err}");
    assert!(
        err.to_string()
            .contains("2/4 ranks joined [0, 2]; missing ranks: [1, 3]"),
        "{err}"
    );
}

#[test]
fn an_interrupt_ends_a_wait_promptly_and_is_checked_every_poll() {
    let s = store();
    let started = Instant::now();
    let mut checks = 0;
    let mut interrupted = || {
        checks += 1;
        if started.elapsed() > Duration::from_millis(500) {
            return Err(Error::Interrupted);
        }
        Ok(())
    };
    let keys = ["never".to_owned()];
    let err = blocking::wait(&s, &keys, Duration::from_secs(30), &mut interrupted).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Interrupted), "{err:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!((2..=8).contains(&checks), "{checks} checks in {took:?}");
    let err = blocking::get(&s, "never", Duration::from_secs(30), &mut || {
        Err(Error::Interrupted)
    })
    .unwrap_err();
    assert!(matches!(err, Error::Interrupted), "{err:?}");
    // The store carries on, and an uninterrupted wait still sees a later write.
    let writer = s.clone_store().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(350));
        writer.set("late", b"1").unwrap();
    });
    let late = ["late".to_owned()];
    blocking::wait(&s, &late, Duration::from_secs(20), &mut || Ok(())).unwrap();
    t.join().unwrap();
}
