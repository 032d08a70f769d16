//! FileStore against real files: two instances sharing one file (as two processes would),
//! torch's cleanup rules, and files that are not FileStore logs.

use std::io::Write;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrodist::store::{FileStore, PrefixStore, Store};
use ferrodist::Error;

fn temp_path() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    (dir, path)
}

#[test]
fn two_instances_see_each_others_writes() {
    let (_dir, path) = temp_path();
    let a = FileStore::new(&path, -1).unwrap();
    let b = FileStore::new(&path, -1).unwrap();
    a.set("k", b"v").unwrap();
    assert_eq!(b.get("k").unwrap(), b"v");
    assert_eq!(b.add("n", 3).unwrap(), 3);
    assert_eq!(a.add("n", 4).unwrap(), 7);
    assert!(b.delete_key("k").unwrap());
    assert!(!a.check(&["k".into()]).unwrap());
    // refcount/ is a key, as in torch: k deleted, n and refcount/ remain.
    assert_eq!(a.num_keys().unwrap(), 2);
    let mut keys = a.list_keys().unwrap();
    keys.sort();
    assert_eq!(keys, vec!["efcount/".to_string(), "n".to_string()]);
}

#[test]
fn the_file_holds_torchs_record_bytes() {
    let (_dir, path) = temp_path();
    let store = FileStore::new(&path, -1).unwrap();
    store.set("a", b"abc").unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        bytes,
        b"\x09\x00\x00\x00refcount/\x01\x00\x00\x001\x02\x00\x00\x00/a\x03\x00\x00\x00abc"
    );
}

#[test]
fn wait_is_released_by_a_writer_in_another_thread() {
    let (_dir, path) = temp_path();
    let reader = FileStore::new(&path, -1).unwrap();
    let writer_path = path.clone();
    let writer = thread::spawn(move || {
        let w = FileStore::new(&writer_path, -1).unwrap();
        thread::sleep(Duration::from_millis(30));
        w.set("late", b"1").unwrap();
    });
    reader
        .wait(&["late".into()], Some(Duration::from_secs(10)))
        .unwrap();
    writer.join().unwrap();
}

#[test]
fn wait_timeout_names_missing_keys_and_is_not_rounded_to_seconds() {
    let (_dir, path) = temp_path();
    let store = FileStore::new(&path, -1).unwrap();
    store.set("here", b"1").unwrap();
    let start = Instant::now();
    let err = store
        .wait(
            &["here".into(), "gone".into()],
            Some(Duration::from_millis(50)),
        )
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(900));
    let text = err.to_string();
    assert!(err.is_timeout() && text.contains("gone") && !text.contains("here"));
}

#[test]
fn compare_set_follows_torchs_four_cases() {
    let (_dir, path) = temp_path();
    let store = FileStore::new(&path, -1).unwrap();
    assert_eq!(store.compare_set("k", b"x", b"y").unwrap(), b"x");
    assert_eq!(store.compare_set("k", b"", b"y").unwrap(), b"y");
    assert_eq!(store.compare_set("k", b"y", b"z").unwrap(), b"z");
    assert_eq!(store.compare_set("k", b"q", b"w").unwrap(), b"z");
}

#[test]
fn last_instance_out_removes_the_file_only_with_a_world_size() {
    let (_dir, path) = temp_path();
    let a = FileStore::new(&path, 1).unwrap();
    let b = a.clone_store().unwrap();
    drop(a);
    assert!(path.exists(), "one instance is still open");
    drop(b);
    assert!(!path.exists(), "the last instance removes the file");

    let kept = FileStore::new(&path, -1).unwrap();
    drop(kept);
    assert!(path.exists(), "world_size -1 never removes the file");
}

#[test]
fn a_recreated_file_is_followed() {
    let (_dir, path) = temp_path();
    let a = FileStore::new(&path, -1).unwrap();
    a.set("old", b"1").unwrap();
    std::fs::remove_file(&path).unwrap();
    let b = FileStore::new(&path, -1).unwrap();
    b.set("new", b"2").unwrap();
    assert!(!a.check(&["old".into()]).unwrap());
    assert_eq!(a.get("new").unwrap(), b"2");
}

fn corrupt_error(bytes: &[u8]) -> Error {
    let (_dir, path) = temp_path();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    match FileStore::new(&path, -1) {
        Err(err) => err,
        Ok(_) => panic!("opened a file that is not a FileStore log"),
    }
}

#[test]
fn random_bytes_are_a_clear_error_not_a_hang() {
    let bytes: Vec<u8> = (0..200u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let err = corrupt_error(&bytes);
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
}

#[test]
fn a_truncated_record_is_a_clear_error() {
    let err = corrupt_error(b"\x05\x00\x00\x00/ab");
    let text = err.to_string();
    assert!(matches!(err, Error::Corrupt { .. }), "{text}");
    assert!(text.contains("truncated"), "{text}");
}

#[test]
fn a_huge_length_prefix_is_refused_without_allocating_it() {
    let err = corrupt_error(b"\xff\xff\xff\x7f/");
    assert!(err.to_string().contains("2147483651 bytes"), "{err}");
}

#[test]
fn prefix_store_over_a_file_store() {
    let (_dir, path) = temp_path();
    let base: Arc<dyn Store> = Arc::new(FileStore::new(&path, -1).unwrap());
    let prefixed = PrefixStore::new("p", base.clone());
    prefixed.set("k", b"v").unwrap();
    assert_eq!(base.get("p/k").unwrap(), b"v");
    assert!(!prefixed.capabilities().extended_api);
    prefixed.append("k", b"w").unwrap();
    assert_eq!(prefixed.get("k").unwrap(), b"vw");
}

#[test]
fn readers_wait_for_a_missing_file_then_time_out() {
    let (_dir, path) = temp_path();
    let store = FileStore::new(&path, -1).unwrap();
    std::fs::remove_file(&path).unwrap();
    store.set_timeout(Duration::from_millis(50));
    let err = store.num_keys().unwrap_err();
    assert!(
        err.is_timeout() && err.to_string().contains("does not exist"),
        "{err}"
    );
    assert!(!store.check(&["k".into()]).unwrap());
    // A writer recreates it, as torch's writers do.
    store.set("k", b"v").unwrap();
    assert_eq!(store.num_keys().unwrap(), 1);
}

#[test]
fn an_unopenable_path_is_a_store_error_naming_it() {
    let err = match FileStore::new("/nonexistent-dir/f", 1) {
        Err(err) => err,
        Ok(_) => panic!("opened a file in a directory that does not exist"),
    };
    assert!(matches!(err, Error::Store(_)), "{err}");
    assert!(err.to_string().contains("/nonexistent-dir/f"), "{err}");
}

#[test]
fn a_store_file_replaced_by_a_directory_is_a_store_error_not_a_wait_timeout() {
    let (_dir, path) = temp_path();
    let store = FileStore::new(&path, -1).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    for err in [
        store
            .wait(&["k".into()], Some(Duration::from_secs(5)))
            .unwrap_err(),
        store.get_timeout("k", Duration::from_secs(5)).unwrap_err(),
    ] {
        assert!(matches!(err, Error::Store(_)), "{err}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }
    // A timeout still reads as one once the file is back.
    std::fs::remove_dir(&path).unwrap();
    store.set("other", b"1").unwrap();
    let started = Instant::now();
    let err = store
        .wait(&["k".into()], Some(Duration::from_millis(50)))
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[test]
fn a_lock_held_past_the_timeout_is_a_timeout_naming_the_file() {
    use std::os::unix::io::AsRawFd;
    let (_dir, path) = temp_path();
    let store = FileStore::new(&path, -1).unwrap();
    store.set_timeout(Duration::from_millis(50));
    let holder = std::fs::File::open(&path).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
    let err = store.set("k", b"v").unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    drop(holder);
    store.set("k", b"v").unwrap();
}

#[test]
fn concurrent_adds_from_many_instances_are_never_lost() {
    let (_dir, path) = temp_path();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            thread::spawn(move || {
                // Separate instances: separate descriptors, excluded from each other by flock.
                let store = FileStore::new(&path, -1).unwrap();
                for _ in 0..100 {
                    store.add("counter", 1).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let store = FileStore::new(&path, -1).unwrap();
    assert_eq!(store.get("counter").unwrap(), b"400");
}
