//! Blocking `queue_pop` with a deadline ([`Store::queue_pop_timeout`]) on every kind of store:
//! consumers racing for one element, and timeouts that pop nothing.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrodist::store::{HashStore, PrefixStore, Store};
use ferrodist::tcp::{TcpStore, TcpStoreOptions};

fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    let tcp = TcpStore::new(TcpStoreOptions {
        is_master: true,
        timeout: Duration::from_secs(10),
        ..TcpStoreOptions::default()
    })
    .expect("master starts");
    vec![
        ("hash", Arc::new(HashStore::new())),
        (
            "prefix",
            Arc::new(PrefixStore::new("p", Arc::new(HashStore::new()))),
        ),
        ("tcp", Arc::new(tcp)),
    ]
}

#[test]
fn a_consumer_that_loses_the_race_keeps_waiting_within_its_deadline() {
    for (name, store) in stores() {
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let store = match store.clone_store() {
                    Ok(clone) => clone,
                    Err(err) => panic!("{name}: clone: {err}"),
                };
                thread::spawn(move || store.queue_pop_timeout("q", Duration::from_secs(10)))
            })
            .collect();
        thread::sleep(Duration::from_millis(100));
        store.queue_push("q", b"first").unwrap();
        thread::sleep(Duration::from_millis(100));
        store.queue_push("q", b"second").unwrap();
        let mut got: Vec<Vec<u8>> = consumers
            .into_iter()
            .map(|c| c.join().unwrap().unwrap_or_else(|e| panic!("{name}: {e}")))
            .collect();
        got.sort();
        assert_eq!(got, [b"first".to_vec(), b"second".to_vec()], "{name}");
    }
}

#[test]
fn a_timed_out_pop_reports_the_whole_timeout_and_pops_nothing() {
    for (name, store) in stores() {
        let started = Instant::now();
        let err = store
            .queue_pop_timeout("empty", Duration::from_millis(60))
            .unwrap_err();
        assert!(err.is_timeout(), "{name}: {err}");
        assert!(err.to_string().contains("60ms"), "{name}: {err}");
        assert!(started.elapsed() >= Duration::from_millis(60), "{name}");
        store.queue_push("late", b"x").unwrap();
        assert_eq!(
            store.queue_pop_timeout("late", Duration::ZERO).unwrap(),
            b"x",
            "{name}: zero waits without a deadline and finds what is there"
        );
        assert_eq!(store.queue_len("late").unwrap(), 0, "{name}");
    }
}
