//! The blocking half of a `Store` over an engine, written once: `get`, `multi_get`, `wait` and
//! a blocking `queue_pop` for HashStore (over the in-memory [`Db`]) and EtcdStore (over etcd).
//!
//! Each of these calls is the same loop: look, and if what it needs is not there, take a wait
//! from the engine (a registration woken by writers, or a watch), block this thread on it until
//! it is released, the deadline passes or the caller is interrupted, and look again (a key may
//! have been deleted, or a queue emptied by another consumer, meanwhile). What differs between
//! the engines is only how to look, how a wait is taken and how a thread blocks on it: that is
//! [`BlockingEngine`]. The non-blocking calls of both stores are their engine's operations
//! themselves, the same ones the TCP server dispatches the wire to.
//!
//! Every engine's waits are interruptible here: given an interruption check (Python's Ctrl-C), a
//! blocked thread wakes every [`INTERRUPT_POLL`] to run it beside one wait that stays armed, so
//! no wait is set up again for the check. Without one, it sleeps until released or the deadline.

use std::time::Duration;

use bytes::Bytes;

use super::db::{Db, Waiter};
use super::{Blocking, Deadline, Interrupt, Unblocked, INTERRUPT_POLL};
use crate::error::{Error, Result};

/// What the blocking calls need of an engine.
pub trait BlockingEngine {
    /// A wait taken on the engine, released by a change to what it waits for.
    type Wait;

    /// Every key's value when all have one, else a wait released when a missing one changes.
    fn values_or_wait(&self, keys: &[Bytes]) -> Result<Result<Vec<Bytes>, Self::Wait>>;
    /// `None` when every key is present (a value or a non-empty queue), else a wait.
    fn present_or_wait(&self, keys: &[Bytes]) -> Result<Option<Self::Wait>>;
    /// The front of queue `key`, taken off it, else a wait released by a change to it.
    fn pop_or_wait(&self, key: &Bytes) -> Result<Result<Bytes, Self::Wait>>;
    /// Blocks this thread until `wait` is released (true) or `deadline` passes (false), running
    /// `interrupted` (when given) every [`INTERRUPT_POLL`]; its error ends the call.
    fn block(
        &self,
        wait: Self::Wait,
        deadline: Deadline,
        interrupted: Option<&mut (dyn FnMut() -> Result<()> + '_)>,
    ) -> Result<bool>;
    /// The keys of `keys` missing now, for a timeout's message.
    fn missing(&self, keys: &[Bytes]) -> Vec<Bytes>;
}

/// The values of `keys`, waiting up to `timeout` (zero: forever) for the missing ones.
pub fn values<E: BlockingEngine>(
    engine: &E,
    op: &str,
    keys: &[Bytes],
    timeout: Duration,
    interrupted: Option<Interrupt<'_>>,
) -> Result<Vec<Vec<u8>>> {
    let values = until(engine, op, keys, timeout, interrupted, || {
        engine.values_or_wait(keys)
    })?;
    Ok(values.iter().map(|v| v.to_vec()).collect())
}

/// Waits up to `timeout` (zero: forever) until every key is present.
pub fn present<E: BlockingEngine>(
    engine: &E,
    op: &str,
    keys: &[Bytes],
    timeout: Duration,
    interrupted: Option<Interrupt<'_>>,
) -> Result<()> {
    until(engine, op, keys, timeout, interrupted, || {
        Ok(match engine.present_or_wait(keys)? {
            None => Ok(()),
            Some(wait) => Err(wait),
        })
    })
}

/// Pops the front of queue `key`, waiting up to `timeout` (zero: forever) for a push.
pub fn pop<E: BlockingEngine>(
    engine: &E,
    key: &Bytes,
    timeout: Duration,
    interrupted: Option<Interrupt<'_>>,
) -> Result<Vec<u8>> {
    let keys = std::slice::from_ref(key);
    until(engine, "queue_pop", keys, timeout, interrupted, || {
        engine.pop_or_wait(key)
    })
    .map(|front| front.to_vec())
}

/// A key as the engine takes it.
pub fn key_bytes(key: &str) -> Bytes {
    Bytes::copy_from_slice(key.as_bytes())
}

/// Keys as the engine takes them.
pub fn keys_bytes(keys: &[String]) -> Vec<Bytes> {
    keys.iter().map(|k| key_bytes(k)).collect()
}

/// One of the `Store` API's blocking calls over `engine`, with no deadline beyond `timeout`
/// and `interrupted` run beside the wait: what both stores' `block_interruptibly` are.
pub fn block_interruptibly<E: BlockingEngine>(
    engine: &E,
    call: Blocking<'_>,
    timeout: Duration,
    interrupted: Interrupt<'_>,
) -> Result<Unblocked> {
    let interrupted = Some(interrupted);
    match call {
        Blocking::Get(key) => values(engine, "get", &[key_bytes(key)], timeout, interrupted)
            .map(|mut values| Unblocked::Value(values.pop().expect("one key, one value"))),
        Blocking::Wait(keys) => present(engine, "wait", &keys_bytes(keys), timeout, interrupted)
            .map(|()| Unblocked::Ready),
        Blocking::MultiGet(keys) => {
            values(engine, "multi_get", &keys_bytes(keys), timeout, interrupted)
                .map(Unblocked::Values)
        }
        Blocking::QueuePop(key) => {
            pop(engine, &key_bytes(key), timeout, interrupted).map(Unblocked::Value)
        }
    }
}

/// Looks with `attempt` until it finds what it needs, blocking on the wait it hands back
/// between looks. Past the deadline it looks once more (a wait shorter than one round trip to
/// the engine must not fail a call whose keys are all there), then fails naming the keys of
/// `keys` still missing, with the whole `timeout`.
fn until<E: BlockingEngine, T>(
    engine: &E,
    op: &str,
    keys: &[Bytes],
    timeout: Duration,
    mut interrupted: Option<Interrupt<'_>>,
    mut attempt: impl FnMut() -> Result<Result<T, E::Wait>>,
) -> Result<T> {
    let deadline = Deadline::after(timeout);
    loop {
        let wait = match attempt()? {
            Ok(found) => return Ok(found),
            Err(wait) => wait,
        };
        if engine.block(wait, deadline, interrupted.as_deref_mut())? {
            continue;
        }
        if let Ok(found) = attempt()? {
            return Ok(found);
        }
        let missing: Vec<String> = engine
            .missing(keys)
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        return Err(Error::wait_timeout(op, timeout, &missing));
    }
}

impl BlockingEngine for Db {
    type Wait = Waiter;

    fn values_or_wait(&self, keys: &[Bytes]) -> Result<Result<Vec<Bytes>, Waiter>> {
        Ok(Db::values_or_wait(self, keys))
    }

    fn present_or_wait(&self, keys: &[Bytes]) -> Result<Option<Waiter>> {
        Ok(self.wait(keys.to_vec()))
    }

    fn pop_or_wait(&self, key: &Bytes) -> Result<Result<Bytes, Waiter>> {
        Ok(self.queue_pop_or_wait(key))
    }

    /// Parks the thread (a writer unparks it), in slices of at most [`INTERRUPT_POLL`] when
    /// there is an interruption check.
    fn block(
        &self,
        mut wait: Waiter,
        deadline: Deadline,
        interrupted: Option<&mut (dyn FnMut() -> Result<()> + '_)>,
    ) -> Result<bool> {
        let Some(interrupted) = interrupted else {
            return Ok(wait.block_until(deadline));
        };
        loop {
            let slice = Deadline::after(match deadline.remaining() {
                Some(left) if left.is_zero() => return Ok(false),
                Some(left) => left.min(INTERRUPT_POLL),
                None => INTERRUPT_POLL,
            });
            if wait.block_until(slice) {
                return Ok(true);
            }
            interrupted()?;
        }
    }

    fn missing(&self, keys: &[Bytes]) -> Vec<Bytes> {
        Db::missing(self, keys)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Instant;

    use super::*;

    #[test]
    fn an_interruption_ends_a_wait_promptly_and_leaves_no_registration() {
        let db = Db::new();
        let checks = Cell::new(0);
        let mut interrupted = || {
            checks.set(checks.get() + 1);
            if checks.get() == 3 {
                return Err(Error::Interrupted);
            }
            Ok(())
        };
        let started = Instant::now();
        let keys = [key_bytes("never")];
        let err = values(
            &db,
            "get",
            &keys,
            Duration::from_secs(30),
            Some(&mut interrupted),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Interrupted), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(
            checks.get(),
            3,
            "checked every slice, stopped at the first error"
        );
        assert_eq!(db.pending_waits(), 0);
    }

    #[test]
    fn a_wait_with_checks_is_released_by_a_write_and_a_timeout_names_what_is_missing() {
        let db = Db::new();
        let writer = db.clone();
        let handle = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(250));
            writer.set(key_bytes("late"), Bytes::from_static(b"v"));
        });
        let mut never = || Ok(());
        let keys = [key_bytes("late")];
        let found = values(&db, "get", &keys, Duration::from_secs(10), Some(&mut never));
        assert_eq!(found.unwrap(), vec![b"v".to_vec()]);
        handle.join().unwrap();

        let keys = [key_bytes("late"), key_bytes("gone")];
        let err = present(
            &db,
            "wait",
            &keys,
            Duration::from_millis(150),
            Some(&mut never),
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Timeout { after, detail, .. }
                if *after == Duration::from_millis(150) && detail == "keys: {gone}"),
            "{err}"
        );
    }

    #[test]
    fn a_pop_waits_for_a_push() {
        let db = Db::new();
        let writer = db.clone();
        let handle = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            writer.queue_push(key_bytes("q"), Bytes::from_static(b"x"));
        });
        assert_eq!(
            pop(&db, &key_bytes("q"), Duration::from_secs(10), None).unwrap(),
            b"x"
        );
        handle.join().unwrap();
    }
}
