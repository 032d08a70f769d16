//! The open FileStore file and its `flock(2)` lock.
//!
//! torch opens the file, takes a `flock` lock, works and closes it on every operation. We keep
//! one descriptor open between operations (saving an `open`/`close` pair per call) and stay
//! exactly as safe by re-checking, before each operation, the two cases where a kept descriptor
//! would go stale:
//!
//! * **the file was unlinked** (the last instance cleaned it up, and the path may already name
//!   a new file): the `fstat` each operation makes for the file size also gives the link count,
//!   and a count of 0 reopens by path;
//! * **we are a forked child**: a `flock` belongs to the open file description, which a fork
//!   shares, so parent and child would not exclude each other; a new pid reopens.
//!
//! `flock`, not `fcntl`: on Linux the two lock kinds ignore each other, and torch uses `flock`.
//! Lock waits poll with `LOCK_NB` against a deadline, so a peer stopped while holding the lock
//! cannot hang us forever.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
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

/// The FileStore file, opened read-write, and the process that opened it.
pub struct OpenLog {
    /// The open file.
    pub file: File,
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
        Ok(Some(OpenLog {
            file,
            pid: std::process::id(),
        }))
    }

    /// False in a forked child, which must not share its parent's lock (see the module doc).
    pub fn opened_by_this_process(&self) -> bool {
        self.pid == std::process::id()
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
