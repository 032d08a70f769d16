//! Control collectives over a real HashStore, one thread per rank.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrodist::collectives::StoreCollectives;
use ferrodist::store::{HashStore, Store};
use ferrodist::Error;

const LONG: Duration = Duration::from_secs(10);

fn no_interrupt() -> impl FnMut() -> ferrodist::Result<()> {
    || Ok(())
}

/// Runs `body(rank, collectives)` on `world` threads sharing one store.
fn on_ranks<T: Send + 'static>(
    world: i64,
    body: impl Fn(i64, &StoreCollectives) -> T + Send + Sync + 'static,
) -> (Arc<dyn Store>, Vec<T>) {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let body = Arc::new(body);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (store, body) = (store.clone(), body.clone());
            thread::spawn(move || {
                let c = StoreCollectives::new(store, rank, world).unwrap();
                body(rank, &c)
            })
        })
        .collect();
    let results = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (store, results)
}

#[test]
fn all_gather_and_all_sum_agree_on_every_rank() {
    let (store, results) = on_ranks(5, |rank, c| {
        let gathered = c
            .all_gather(
                "ag",
                format!("r{rank}").as_bytes(),
                LONG,
                &mut no_interrupt(),
            )
            .unwrap();
        let sum = c
            .all_sum("sum", rank * 10, LONG, &mut no_interrupt())
            .unwrap();
        (gathered, sum)
    });
    let expected: Vec<Vec<u8>> = (0..5).map(|r| format!("r{r}").into_bytes()).collect();
    for (gathered, sum) in results {
        assert_eq!(gathered, expected);
        assert_eq!(sum, 100);
    }
    // torch's layout: the running sum under the key itself, the barrier under key/barrier.
    assert_eq!(store.get("sum").unwrap(), b"100");
    assert_eq!(store.get("sum/barrier/num_members").unwrap(), b"5");
    assert_eq!(
        store.get("sum/barrier/last_members").unwrap(),
        b"<val_ignored>"
    );
}

#[test]
fn barrier_writes_torch_keys() {
    let (store, _) = on_ranks(3, |_, c| {
        c.barrier("b", LONG, true, &mut no_interrupt()).unwrap()
    });
    for rank in 0..3 {
        assert_eq!(store.get(&format!("b/{rank}")).unwrap(), b"joined");
    }
    assert_eq!(store.get("b/num_members").unwrap(), b"3");
}

#[test]
fn gather_and_scatter_put_each_rank_in_its_place() {
    let (store, results) = on_ranks(4, |rank, c| {
        if rank == 2 {
            let mine = c
                .scatter_send(
                    "sc",
                    &(0..4).map(|i| vec![i as u8]).collect::<Vec<_>>(),
                    LONG,
                )
                .unwrap();
            let all = c
                .gather_recv("g", b"root", LONG, &mut no_interrupt())
                .unwrap();
            (mine, all)
        } else {
            let mine = c.scatter_recv("sc", LONG, &mut no_interrupt()).unwrap();
            c.gather_send("g", &[b'g', rank as u8], LONG).unwrap();
            (mine, Vec::new())
        }
    });
    for (rank, (mine, _)) in results.iter().enumerate() {
        assert_eq!(mine, &vec![rank as u8]);
    }
    let expected: Vec<Vec<u8>> = vec![
        vec![b'g', 0],
        vec![b'g', 1],
        b"root".to_vec(),
        vec![b'g', 3],
    ];
    assert_eq!(results[2].1, expected);
    // The root writes neither its own scatter key nor its own gather key, as in torch.
    assert!(!store.check(&["sc/2".to_string()]).unwrap());
    assert!(!store.check(&["g/2".to_string()]).unwrap());
}

#[test]
fn timeout_names_missing_ranks_within_the_deadline() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    store.set("ag/2", b"early").unwrap();
    let c = StoreCollectives::new(store, 1, 4).unwrap();
    let started = Instant::now();
    let err = c
        .all_gather("ag", b"x", Duration::from_millis(150), &mut no_interrupt())
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(matches!(err, Error::RanksMissing { ref missing, .. } if missing == &[0, 3]));
    assert!(err
        .to_string()
        .starts_with("all_gather failed -- missing ranks: 0, 3, wait timeout after 150ms"));
}

#[test]
fn reused_key_is_refused_and_all_sum_claims_its_barrier() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let c = StoreCollectives::new(store, 0, 1).unwrap();
    c.broadcast_send("k", b"v", LONG).unwrap();
    let err = c.barrier("k", LONG, true, &mut no_interrupt()).unwrap_err();
    assert_eq!(err.to_string(), "Key k has already been used.");
    assert_eq!(c.all_sum("s", 7, LONG, &mut no_interrupt()).unwrap(), 7);
    let err = c
        .barrier("s/barrier", LONG, true, &mut no_interrupt())
        .unwrap_err();
    assert_eq!(err.to_string(), "Key s/barrier has already been used.");
}

#[test]
fn bad_rank_and_scatter_length_are_rejected() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    assert!(StoreCollectives::new(store.clone(), 3, 3).is_err());
    assert!(StoreCollectives::new(store.clone(), 0, 0).is_err());
    let c = StoreCollectives::new(store, 0, 3).unwrap();
    let err = c.scatter_send("sc", &[vec![1], vec![2]], LONG).unwrap_err();
    assert!(err.to_string().contains("one entry per rank (3), got 2"));
}

#[test]
fn non_blocking_barrier_returns_at_once() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let c = StoreCollectives::new(store.clone(), 0, 2).unwrap();
    c.barrier("nb", Duration::from_millis(1), false, &mut no_interrupt())
        .unwrap();
    assert!(!store.check(&["nb/last_members".to_string()]).unwrap());
    let last = StoreCollectives::new(store.clone(), 1, 2).unwrap();
    last.barrier("nb", LONG, true, &mut no_interrupt()).unwrap();
    assert!(store.check(&["nb/last_members".to_string()]).unwrap());
}

#[test]
fn interrupt_ends_a_long_wait() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let c = StoreCollectives::new(store, 0, 2).unwrap();
    let started = Instant::now();
    let mut calls = 0;
    let mut interrupt = || {
        calls += 1;
        if calls >= 2 {
            Err(Error::Interrupted)
        } else {
            Ok(())
        }
    };
    let err = c.broadcast_recv("never", LONG, &mut interrupt).unwrap_err();
    assert!(matches!(err, Error::Interrupted));
    assert!(started.elapsed() < Duration::from_secs(2));
}
