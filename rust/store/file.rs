//! FileStore: a store in one file, shared with torch's `FileStore` byte for byte.
//!
//! The file is torch's append-only record log ([`super::file_log`]) guarded by `flock`
//! (`file_lock.rs`), so a torch process and a ferrodist process can rendezvous through one
//! file in either direction. Each instance replays the log into a cache and remembers how far it
//! has read; an operation only parses what others appended since.
//!
//! Where we differ from torch, we are safer and never incompatible:
//!
//! * every record goes to disk in **one** `write(2)` at the end of the file, so a writer killed
//!   mid-stream leaves whole records only (torch writes a record in four calls and can leave
//!   half of one, which hangs torch's own readers). Caveat: Linux may still cut a write that
//!   crosses a page boundary if the kill lands in between its page copies; that window is
//!   nanoseconds wide for a store's small records, and such a tail is then reported as a
//!   truncated record, never misread;
//! * a file that is not a FileStore log (random bytes, a cut record) is a clear
//!   [`Error::Corrupt`], not a hang or a crash, and lengths read off disk are checked against
//!   the bytes really there before use;
//! * timeouts are exact (torch rounds elapsed time down to whole seconds).
//!
//! Lifetime follows torch exactly: creating an instance adds 1 to `refcount/`; dropping one adds
//! 1 to `cleanup/` and -1 to `refcount/`, and the last one out unlinks the file when
//! `world_size >= 0` and at least `world_size` instances have finished.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::file_lock::{LockMode, OpenLog};
use super::file_log::{self, CLEANUP_KEY, REFCOUNT_KEY, TOMBSTONE, USER_PREFIX};
use super::{parse_counter, Deadline, Store, DEFAULT_TIMEOUT};
use crate::error::{Error, Result};

/// How long a reader sleeps between looks at a file that has not grown (torch: 10 ms).
const POLL_MAX: Duration = Duration::from_millis(10);

/// What an instance has replayed: how far into the file, and the resulting map (keys as
/// stored: `/k`, `refcount/`, `cleanup/`).
#[derive(Default)]
struct Replica {
    offset: u64,
    map: HashMap<String, Vec<u8>>,
}

/// The open file and the replica of its contents; reset together when the file changes.
#[derive(Default)]
struct State {
    log: Option<OpenLog>,
    replica: Replica,
}

/// A store kept in a file that torch's `FileStore` can share.
pub struct FileStore {
    path: PathBuf,
    world_size: i64,
    state: Mutex<State>,
    timeout: Mutex<Duration>,
}

impl FileStore {
    /// Opens (creating if needed) the store file at `path` and registers this instance in its
    /// `refcount/`. `world_size` < 0 keeps the file forever; otherwise the last instance to go
    /// unlinks it once `world_size` instances have finished.
    pub fn new(path: impl AsRef<Path>, world_size: i64) -> Result<Self> {
        let store = FileStore {
            path: path.as_ref().to_path_buf(),
            world_size,
            state: Mutex::new(State::default()),
            timeout: Mutex::new(DEFAULT_TIMEOUT),
        };
        store.add_raw(REFCOUNT_KEY, 1)?;
        Ok(store)
    }

    /// The path of the store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The world size the instance was built with (-1: never clean up).
    pub fn world_size(&self) -> i64 {
        self.world_size
    }

    fn corrupt(&self, reason: impl ToString) -> Error {
        Error::Corrupt {
            path: self.path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    /// An I/O failure on the store file: a store error naming the file, as torch raises
    /// `DistStoreError` for it (a caller catching `RuntimeError` still catches it).
    fn io_failed(&self, what: &str, err: std::io::Error) -> Error {
        Error::Store(format!(
            "cannot {what} FileStore file {}: {err}",
            self.path.display()
        ))
    }

    /// Runs `op` on an up-to-date replica while holding a `mode` lock on the file. Readers get
    /// `Ok(None)` while the file does not exist (torch's readers wait for it); writers create it.
    fn locked<T>(
        &self,
        mode: LockMode,
        op: impl FnOnce(&OpenLog, &mut Replica) -> Result<T>,
    ) -> Result<Option<T>> {
        // Every replica update is applied whole or not at all, so a poisoned lock is usable.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State { log, replica } = &mut *state;
        loop {
            if !log.as_ref().is_some_and(OpenLog::opened_by_this_process) {
                // First use, a file removed by cleanup, or a forked child: start over.
                *replica = Replica::default();
                *log = OpenLog::open(&self.path, mode == LockMode::Exclusive)
                    .map_err(|err| self.io_failed("open", err))?;
            }
            let Some(open) = log.as_ref() else {
                return Ok(None);
            };
            let deadline = Deadline::after(self.timeout());
            let lock = open.lock(mode, deadline).map_err(|err| match err.kind() {
                std::io::ErrorKind::TimedOut => Error::Timeout {
                    op: "lock".into(),
                    after: deadline.timeout(),
                    detail: format!(
                        "file {} stayed locked by another process",
                        self.path.display()
                    ),
                },
                _ => self.io_failed("lock", err),
            })?;
            let meta = open
                .file
                .metadata()
                .map_err(|err| self.io_failed("stat", err))?;
            if meta.nlink() == 0 {
                // Unlinked (the last instance cleaned up): the path may name a new file now.
                drop(lock);
                *log = None;
                continue;
            }
            self.catch_up(open, replica, meta.len())?;
            return op(open, replica).map(Some);
        }
    }

    /// Like [`Self::locked`] under the exclusive lock, which always finds (or creates) the file.
    fn write_locked<T>(&self, op: impl FnOnce(&OpenLog, &mut Replica) -> Result<T>) -> Result<T> {
        self.locked(LockMode::Exclusive, op)?
            .ok_or_else(|| self.corrupt("the file vanished while being created"))
    }

    /// Replays whatever others appended since our last look.
    fn catch_up(&self, log: &OpenLog, replica: &mut Replica, size: u64) -> Result<()> {
        let offset = replica.offset;
        if size < offset {
            return Err(self.corrupt(format!(
                "the file shrank from {offset} to {size} bytes while in use"
            )));
        }
        if size > offset {
            // Sized by what is really on disk, never by a length field read from it.
            let mut tail = vec![0u8; (size - offset) as usize];
            log.file
                .read_exact_at(&mut tail, offset)
                .map_err(|err| self.io_failed("read", err))?;
            file_log::replay(&tail, &mut replica.map).map_err(|err| {
                self.corrupt(format!("{err}, counting from byte {offset} of the file"))
            })?;
            replica.offset = size;
        }
        Ok(())
    }

    /// Appends one record in a single write at the end of the file (we hold the exclusive lock
    /// and have caught up, so our offset is the end) and applies it to the replica.
    fn append_record(
        &self,
        log: &OpenLog,
        replica: &mut Replica,
        key: &str,
        value: &[u8],
    ) -> Result<()> {
        let mut record = Vec::new();
        if !file_log::encode_record(key.as_bytes(), value, &mut record) {
            return Err(Error::InvalidArgument(format!(
                "key or value of '{key}' is over 4 GiB, which the FileStore format cannot hold"
            )));
        }
        log.file
            .write_all_at(&record, replica.offset)
            .map_err(|err| self.io_failed("write", err))?;
        replica.offset += record.len() as u64;
        match key.strip_prefix(TOMBSTONE as char) {
            Some(deleted) => replica.map.remove(deleted),
            None => replica.map.insert(key.to_owned(), value.to_vec()),
        };
        Ok(())
    }

    /// `add` on a key as stored in the file (user keys carry their `/`).
    fn add_raw(&self, raw_key: &str, amount: i64) -> Result<i64> {
        self.write_locked(|log, replica| {
            let current = match replica.map.get(raw_key) {
                None => 0,
                Some(v) if v.is_empty() => 0,
                Some(v) => parse_counter(raw_key.trim_start_matches(USER_PREFIX), v)?,
            };
            let next = current.wrapping_add(amount);
            self.append_record(log, replica, raw_key, next.to_string().as_bytes())?;
            Ok(next)
        })
    }

    /// Looks at the replica under a shared lock; `None` while the file does not exist.
    fn read<T>(&self, op: impl FnOnce(&Replica) -> T) -> Result<Option<T>> {
        self.locked(LockMode::Shared, |_, replica| Ok(op(replica)))
    }

    /// Reads the replica, waiting (store timeout) for the file to exist, as torch's readers do.
    fn when_present<T>(&self, op: &str, read: impl Fn(&Replica) -> T) -> Result<T> {
        let timeout = self.timeout();
        self.poll(timeout, |replica| Some(read(replica)))?
            .ok_or_else(|| Error::Timeout {
                op: op.to_owned(),
                after: timeout,
                detail: format!("file {} does not exist", self.path.display()),
            })
    }

    /// Polls `ready` until it yields a value or `timeout` (zero: never) passes. `Ok(None)` means
    /// the deadline passed; every `Err` is a real failure (the file could not be opened, read or
    /// locked), never a disguised timeout, so callers cannot mistake one for the other.
    fn poll<T>(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&Replica) -> Option<T>,
    ) -> Result<Option<T>> {
        let deadline = Deadline::after(timeout);
        let mut pause = Duration::from_micros(500);
        loop {
            if let Some(found) = self.read(&mut ready)?.flatten() {
                return Ok(Some(found));
            }
            match deadline.remaining() {
                Some(left) if left.is_zero() => return Ok(None),
                left => std::thread::sleep(left.map_or(pause, |l| l.min(pause))),
            }
            pause = (pause * 2).min(POLL_MAX);
        }
    }
}

fn user_key(key: &str) -> String {
    format!("{USER_PREFIX}{key}")
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let raw = user_key(key);
        self.write_locked(|log, replica| self.append_record(log, replica, &raw, value))
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let raw = user_key(key);
        self.poll(timeout, |replica| replica.map.get(&raw).cloned())?
            .ok_or_else(|| Error::wait_timeout("get", timeout, &[key.to_owned()]))
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        self.add_raw(&user_key(key), amount)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let raw = user_key(key);
        self.write_locked(|log, replica| {
            match replica.map.get(&raw) {
                None if !expected.is_empty() => return Ok(expected.to_vec()),
                Some(current) if current != expected => return Ok(current.clone()),
                _ => {}
            }
            self.append_record(log, replica, &raw, desired)?;
            Ok(desired.to_vec())
        })
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        let raw: Vec<String> = keys.iter().map(|k| user_key(k)).collect();
        Ok(self
            .read(|replica| raw.iter().all(|k| replica.map.contains_key(k)))?
            .unwrap_or(false))
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let raw: Vec<String> = keys.iter().map(|k| user_key(k)).collect();
        let mut missing: Vec<String> = keys.to_vec();
        let found = self.poll(timeout, |replica| {
            missing = keys
                .iter()
                .zip(&raw)
                .filter(|(_, r)| !replica.map.contains_key(*r))
                .map(|(k, _)| k.clone())
                .collect();
            missing.is_empty().then_some(())
        })?;
        found.ok_or_else(|| Error::wait_timeout("wait", timeout, &missing))
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        let tombstone = format!("{}{}", TOMBSTONE as char, user_key(key));
        self.write_locked(|log, replica| self.append_record(log, replica, &tombstone, b""))?;
        // torch's FileStore cannot tell and always answers true.
        Ok(true)
    }

    fn num_keys(&self) -> Result<i64> {
        self.when_present("num_keys", |replica| replica.map.len() as i64)
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        // torch builds a new instance on the same path (counted in refcount/).
        Ok(Arc::new(FileStore::new(&self.path, self.world_size)?))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        // torch drops the first character of every stored key: `/k` -> `k`, and its own
        // internal keys come out as `efcount/` and `leanup/`. We return the same list.
        self.when_present("list_keys", |replica| {
            replica
                .map
                .keys()
                .map(|k| k.get(1..).unwrap_or_default().to_owned())
                .collect()
        })
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        // torch's destructor: nothing if the file is gone; else count ourselves finished and
        // leave, and the last instance out removes the file when the world is done with it.
        if !self.path.exists() {
            return;
        }
        let finished = self.add_raw(CLEANUP_KEY, 1);
        let refs = self.add_raw(REFCOUNT_KEY, -1);
        if let (Ok(finished), Ok(0)) = (finished, refs) {
            if self.world_size >= 0 && finished >= self.world_size {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}
