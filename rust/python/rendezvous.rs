//! Bindings for [`crate::rendezvous`]: one rank's rendezvous join over a native store handle.

use pyo3::prelude::*;

use super::blocking::{detached, detached_interruptible};
use super::store::{PyNativeStore, Timeout};
use crate::rendezvous::Join;

/// Seconds waited and who has joined and who is missing (one line), while a rendezvous waits.
type Report = (f64, String);

/// One rank's rendezvous: created on arrival, then waited on until every rank has come.
///
/// Args:
///     store (NativeStore): the shared store.
///     prefix (str): the keys' prefix, unique per attempt.
///     rank (int): this rank.
///     world_size (int): ranks expected.
///     timeout (timedelta | float): for the whole rendezvous (0: none).
#[pyclass(name = "RendezvousJoin", module = "ferrodist._native", frozen)]
pub struct PyRendezvousJoin {
    inner: Join,
    complete: bool,
}

#[pymethods]
impl PyRendezvousJoin {
    #[new]
    fn new(
        py: Python<'_>,
        store: &PyNativeStore,
        prefix: &str,
        rank: usize,
        world_size: usize,
        timeout: Timeout,
    ) -> PyResult<Self> {
        let timeout = timeout.duration()?;
        let store = store.inner.clone();
        let (inner, complete) = detached(py, || {
            Join::arrive(store, prefix, rank, world_size, timeout)
        })?;
        Ok(PyRendezvousJoin { inner, complete })
    }

    /// True when this rank's arrival completed the rendezvous.
    #[getter]
    fn complete(&self) -> bool {
        self.complete
    }

    /// Waits up to ``report_every``: None once every rank has joined, else ``(seconds_waited,
    /// "2/4 ranks joined [0, 2]; missing ranks: [1, 3]")``; past the timeout raises
    /// ``StoreTimeoutError`` naming the missing ranks.
    fn wait(&self, py: Python<'_>, report_every: Timeout) -> PyResult<Option<Report>> {
        let report_every = report_every.duration()?;
        let progress = detached_interruptible(py, |intr| self.inner.wait(report_every, intr))?;
        Ok(progress.map(|p| (p.waited.as_secs_f64(), p.describe())))
    }
}

/// Adds the rendezvous class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRendezvousJoin>()
}
