//! Running blocking core calls from Python: release the GIL, keep Ctrl-C working.
//!
//! [`detached`] runs a call with the GIL released ([`quick`] keeps it for an in-memory store's
//! calls that wait for no key). [`detached_interruptible`] does the same for
//! a call that may wait long, handing it a hook that re-takes the GIL briefly to let Python
//! deliver a pending KeyboardInterrupt; the store calls it at least every
//! [`crate::store::INTERRUPT_POLL`] (between slices of a wait, or beside a watch on etcd).

use pyo3::prelude::*;

use super::errors::{park, to_py};
use crate::error::{Error, Result};

/// Runs `op` with the GIL released and maps its error.
pub fn detached<T: Send>(py: Python<'_>, op: impl FnOnce() -> Result<T> + Send) -> PyResult<T> {
    py.detach(op).map_err(to_py)
}

/// Runs `op`, a store call that waits for no key: with the GIL held on a store in memory
/// (see [`crate::store::Capabilities::in_memory`]), else released as [`detached`].
pub fn quick<T: Send>(
    py: Python<'_>,
    in_memory: bool,
    op: impl FnOnce() -> Result<T> + Send,
) -> PyResult<T> {
    if in_memory {
        op().map_err(to_py)
    } else {
        detached(py, op)
    }
}

/// Runs `op` with the GIL released, handing it a hook that re-takes the GIL briefly to check
/// for Ctrl-C; `op` calls it while it waits (see [`crate::store::blocking`]).
pub fn detached_interruptible<T: Send>(
    py: Python<'_>,
    op: impl FnOnce(&mut dyn FnMut() -> Result<()>) -> Result<T> + Send,
) -> PyResult<T> {
    py.detach(|| {
        let mut interrupted = || {
            Python::attach(|py| py.check_signals()).map_err(|err| {
                park(err);
                Error::Interrupted
            })
        };
        op(&mut interrupted)
    })
    .map_err(to_py)
}
