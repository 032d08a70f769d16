//! Factories for the file and prefix stores; each returns a `NativeStore` handle.
//!
//! The Python classes `ferrodist.FileStore` and `ferrodist.PrefixStore` (python/ferrodist/
//! store.py) check their arguments the way torch does and then call these.

use std::sync::Arc;

use pyo3::prelude::*;

use super::blocking::detached;
use super::store::PyNativeStore;
use crate::store::{FileStore, PrefixStore};

/// A store kept in ``file_name`` in torch's FileStore format (torch's ``FileStore``).
#[pyfunction]
#[pyo3(signature = (file_name, world_size=-1))]
fn file_store(py: Python<'_>, file_name: String, world_size: i64) -> PyResult<PyNativeStore> {
    let store = detached(py, || FileStore::new(&file_name, world_size))?;
    Ok(PyNativeStore::new(Arc::new(store)))
}

/// A view of ``store`` where every key lives under ``prefix/`` (torch's ``PrefixStore``).
#[pyfunction]
fn prefix_store(prefix: String, store: &PyNativeStore) -> PyNativeStore {
    PyNativeStore::new(Arc::new(PrefixStore::new(prefix, store.inner.clone())))
}

/// Adds the factories to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(file_store, m)?)?;
    m.add_function(wrap_pyfunction!(prefix_store, m)?)?;
    Ok(())
}
