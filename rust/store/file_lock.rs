//! The open FileStore file and its `flock(2)` lock.
//!
//! torch opens the file, takes a `flock` lock, works and closes it on every operation. We keep
//! one descriptor open between operations (saving an `open`/`close` pair per call) and stay
//! exactly as safe by re-checking, before each operation, the two cases where a kept descriptor
//! would go stale:
//!
//! * **the path now names another file** (the last instance unlinked it and someone recreated
//!   it, or it is gone): compare `stat(path)` with the descriptor's device and inode;
//! * **we are a forked child**: a `flock` belongs to the open file description, which a fork
//!   shares, so parent and child would not exclude each other; a new pid reopens.
//!
//! `flock`, not `fcntl`: on Linux the two lock kinds ignore each other, and torch uses `flock`.
//! Lock waits poll with `LOCK_NB` against a deadline, so a peer stopped while holding the lock
//! cannot hang us forever.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use super::Deadline;

/// Shared (readers) or exclusive (writers) lock, as torch takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// `LOCK_SH`: get, check, num_keys, list_keys.
    Shared,
    /// `LOCK_EX`: set, add, compare_set, delete_key.
    Exclusive,
}

/// The FileStore file, opened read-write, with the identity it was opened under.
pub struct OpenLog {
    /// The open file.
    pub file: File,
    dev: u64,
    ino: u64,
    pid: u32,
}

impl OpenLog {
    /// Opens `path` read-write (creating it with mode 0644 when `create`); `Ok(None)` when it
    /// does not exist and `create` is false.
    pub fn open(path: &Path, create: bool) -> io::Result<Option<OpenLog>> {
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .mode(0o644)
            .open(path);
        let file = match opened {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
            Err(err) => return Err(err),
        };
        let meta = file.metadata()?;
        Ok(Some(OpenLog {
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            pid: std::process::id(),
        }))
    }

    /// True while `path` still names this file and this process opened it.
    pub fn still_current(&self, path: &Path) -> bool {
        self.pid == std::process::id()
            && std::fs::metadata(path).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
    }

    /// Takes the lock, polling until `deadline`; the lock is released when the guard drops.
    pub fn lock(&self, mode: LockMode, deadline: Deadline) -> io::Result<LockGuard<'_>> {
        let operation = match mode {
            LockMode::Shared => libc::LOCK_SH,
            LockMode::Exclusive => libc::LOCK_EX,
        } | libc::LOCK_NB;
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: flock on a descriptor we own; no memory is passed.
            if unsafe { libc::flock(self.file.as_raw_fd(), operation) } == 0 {
                return Ok(LockGuard { log: self });
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) if !deadline.expired() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
                Some(libc::EWOULDBLOCK) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "timed out waiting for the file lock",
                    ))
                }
                _ => return Err(err),
            }
        }
    }
}

/// Holds a `flock` lock; unlocks on drop.
pub struct LockGuard<'a> {
    log: &'a OpenLog,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking our own descriptor. Closing the file would release it anyway.
        unsafe { libc::flock(self.log.file.as_raw_fd(), libc::LOCK_UN) };
    }
}
