//! Bindings for [`crate::collectives`]: `StoreCollectives` over a native store handle.
//!
//! The Python class `ferrodist.StoreCollectives` picks the handle (a ferrodist store's own, or
//! a foreign-store adapter around a torch store) and forwards here. Every method releases the
//! GIL; waits check for Ctrl-C every 100 ms (`crate::store::blocking`).

use std::time::Duration;

use pyo3::prelude::*;

use super::blocking::{detached, detached_interruptible};
use super::store::{PyNativeStore, Timeout, Value};
use crate::collectives::StoreCollectives;

/// torch's default for every collective: five minutes.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

fn timeout_or_default(timeout: Option<Timeout>) -> PyResult<Duration> {
    timeout.map_or(Ok(DEFAULT_TIMEOUT), |t| t.duration())
}

/// Control collectives of one rank over a native store handle.
#[pyclass(name = "StoreCollectives", module = "ferrodist._native", frozen)]
pub struct PyStoreCollectives {
    inner: StoreCollectives,
}

#[pymethods]
impl PyStoreCollectives {
    #[new]
    fn new(store: &PyNativeStore, rank: i64, world_size: i64) -> PyResult<Self> {
        let inner = StoreCollectives::new(store.inner.clone(), rank, world_size)
            .map_err(super::errors::to_py)?;
        Ok(PyStoreCollectives { inner })
    }

    #[pyo3(signature = (key, timeout=None, block=true))]
    fn barrier(
        &self,
        py: Python<'_>,
        key: &str,
        timeout: Option<Timeout>,
        block: bool,
    ) -> PyResult<()> {
        let timeout = timeout_or_default(timeout)?;
        detached_interruptible(py, |intr| self.inner.barrier(key, timeout, block, intr))
    }

    #[pyo3(signature = (key, data, timeout=None))]
    fn broadcast_send(
        &self,
        py: Python<'_>,
        key: &str,
        data: Value,
        timeout: Option<Timeout>,
    ) -> PyResult<()> {
        let timeout = timeout_or_default(timeout)?;
        let data = data.into_vec();
        detached(py, || self.inner.broadcast_send(key, &data, timeout))
    }

    #[pyo3(signature = (key, timeout=None))]
    fn broadcast_recv(
        &self,
        py: Python<'_>,
        key: &str,
        timeout: Option<Timeout>,
    ) -> PyResult<Vec<u8>> {
        let timeout = timeout_or_default(timeout)?;
        detached_interruptible(py, |intr| self.inner.broadcast_recv(key, timeout, intr))
    }

    #[pyo3(signature = (key, data, timeout=None))]
    fn gather_send(
        &self,
        py: Python<'_>,
        key: &str,
        data: Value,
        timeout: Option<Timeout>,
    ) -> PyResult<()> {
        let timeout = timeout_or_default(timeout)?;
        let data = data.into_vec();
        detached(py, || self.inner.gather_send(key, &data, timeout))
    }

    #[pyo3(signature = (key, data, timeout=None))]
    fn gather_recv(
        &self,
        py: Python<'_>,
        key: &str,
        data: Value,
        timeout: Option<Timeout>,
    ) -> PyResult<Vec<Vec<u8>>> {
        let timeout = timeout_or_default(timeout)?;
        let data = data.into_vec();
        detached_interruptible(py, |intr| self.inner.gather_recv(key, &data, timeout, intr))
    }

    #[pyo3(signature = (key, data, timeout=None))]
    fn scatter_send(
        &self,
        py: Python<'_>,
        key: &str,
        data: Vec<Value>,
        timeout: Option<Timeout>,
    ) -> PyResult<Vec<u8>> {
        let timeout = timeout_or_default(timeout)?;
        let data: Vec<Vec<u8>> = data.into_iter().map(Value::into_vec).collect();
        detached(py, || self.inner.scatter_send(key, &data, timeout))
    }

    #[pyo3(signature = (key, timeout=None))]
    fn scatter_recv(
        &self,
        py: Python<'_>,
        key: &str,
        timeout: Option<Timeout>,
    ) -> PyResult<Vec<u8>> {
        let timeout = timeout_or_default(timeout)?;
        detached_interruptible(py, |intr| self.inner.scatter_recv(key, timeout, intr))
    }

    #[pyo3(signature = (key, data, timeout=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        key: &str,
        data: Value,
        timeout: Option<Timeout>,
    ) -> PyResult<Vec<Vec<u8>>> {
        let timeout = timeout_or_default(timeout)?;
        let data = data.into_vec();
        detached_interruptible(py, |intr| self.inner.all_gather(key, &data, timeout, intr))
    }

    #[pyo3(signature = (key, data, timeout=None))]
    fn all_sum(
        &self,
        py: Python<'_>,
        key: &str,
        data: i64,
        timeout: Option<Timeout>,
    ) -> PyResult<i64> {
        let timeout = timeout_or_default(timeout)?;
        detached_interruptible(py, |intr| self.inner.all_sum(key, data, timeout, intr))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
}

/// Adds the class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStoreCollectives>()
}
