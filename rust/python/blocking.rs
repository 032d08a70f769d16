//! Running blocking core calls from Python: release the GIL, keep Ctrl-C working.
//!
//! [`detached`] runs a call with the GIL released. [`detached_sliced`] does the same for a
//! call that may wait long, cutting the wait into slices (see [`crate::store::sliced`]) and
//! re-taking the GIL between slices to let Python deliver a pending KeyboardInterrupt.

use std::time::Duration;

use pyo3::prelude::*;

use super::errors::{park, to_py};
use crate::error::{Error, Result};
use crate::store::sliced;

/// Runs `op` with the GIL released and maps its error.
pub fn detached<T: Send>(py: Python<'_>, op: impl FnOnce() -> Result<T> + Send) -> PyResult<T> {
    py.detach(op).map_err(to_py)
}

/// Runs a repeatable blocking `op` for up to `timeout`, slice by slice, with the GIL released,
/// raising Python's pending signal (Ctrl-C) between slices.
pub fn detached_sliced<T: Send>(
    py: Python<'_>,
    timeout: Duration,
    op: impl FnMut(Duration) -> Result<T> + Send,
) -> PyResult<T> {
    detached_interruptible(py, |interrupted| sliced(timeout, op, interrupted))
}

/// Runs `op` with the GIL released, handing it a hook that re-takes the GIL briefly to check
/// for Ctrl-C; `op` calls it between slices of its waits (see [`crate::store::sliced`]).
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
