//! A core [`Store`] over any Python store object (torch's `TCPStore`, `FileStore`, a user's
//! subclass), so core algorithms (PrefixStore, control collectives) run over stores ferrodist
//! did not build.
//!
//! Each call takes the GIL, calls the Python method and converts the result; Python exceptions
//! come back as the core error a native store would have raised (timeouts as `Timeout`, torch's
//! `QueueEmptyError` as `QueueEmpty`, `NotImplementedError` as `NotImplemented`), so callers
//! handle foreign and native stores alike.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyAttributeError, PyNotImplementedError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::store::PyNativeStore;
use crate::error::{Error, Result};
use crate::store::Store;

/// A core store that forwards every call to a Python `torch.distributed.Store`.
pub struct ForeignStore {
    object: Py<PyAny>,
}

impl ForeignStore {
    /// Wraps a Python store object.
    pub fn new(object: Py<PyAny>) -> Self {
        ForeignStore { object }
    }

    fn call<T>(
        &self,
        op: &str,
        call: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
        convert: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        Python::attach(|py| {
            let object = self.object.bind(py);
            call(object)
                .and_then(|result| convert(&result))
                .map_err(|err| from_python(py, op, &err))
        })
    }

    fn call_unit(
        &self,
        op: &str,
        call: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
    ) -> Result<()> {
        self.call(op, call, |_| Ok(()))
    }
}

fn to_bytes(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    Ok(value.cast::<PyBytes>()?.as_bytes().to_vec())
}

/// Maps a Python exception from a foreign store onto the core error a native store would give.
fn from_python(py: Python<'_>, op: &str, err: &PyErr) -> Error {
    let message = err.value(py).to_string();
    let is_instance_of = |module: &str, class: &str| -> bool {
        py.import(module)
            .and_then(|m| m.getattr(class))
            .map(|cls| err.value(py).is_instance(&cls).unwrap_or(false))
            .unwrap_or(false)
    };
    if is_instance_of("torch.distributed", "QueueEmptyError") {
        Error::QueueEmpty
    } else if err.is_instance_of::<PyNotImplementedError>(py)
        || err.is_instance_of::<PyAttributeError>(py)
    {
        Error::NotImplemented(message)
    } else if err.is_instance_of::<PyTimeoutError>(py)
        || (is_instance_of("builtins", "RuntimeError")
            && message.to_ascii_lowercase().contains("timeout"))
    {
        Error::Timeout {
            op: op.to_string(),
            after: Duration::ZERO,
            detail: message,
        }
    } else if is_instance_of("torch.distributed", "DistNetworkError") {
        Error::Network(message)
    } else if is_instance_of("builtins", "KeyboardInterrupt") {
        Error::Interrupted
    } else if is_instance_of("builtins", "ValueError") {
        Error::InvalidValue(message)
    } else {
        Error::Store(message)
    }
}

impl Store for ForeignStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call_unit("set", |o| {
            o.call_method1("set", (key, PyBytes::new(o.py(), value)))
        })
    }

    /// The store's own `get`, which waits by its own timeout (as torch's PrefixStore forwards
    /// it): a user's store need not implement `wait` for `get` to work.
    fn get_timeout(&self, key: &str, _timeout: Duration) -> Result<Vec<u8>> {
        self.get(key)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.call("get", |o| o.call_method1("get", (key,)), to_bytes)
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        self.call(
            "add",
            |o| o.call_method1("add", (key, amount)),
            |r| r.extract(),
        )
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.call(
            "compare_set",
            |o| {
                let py = o.py();
                o.call_method1(
                    "compare_set",
                    (key, PyBytes::new(py, expected), PyBytes::new(py, desired)),
                )
            },
            to_bytes,
        )
    }

    fn check(&self, keys: &[String]) -> Result<bool> {
        self.call(
            "check",
            |o| o.call_method1("check", (keys.to_vec(),)),
            |r| r.extract(),
        )
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        let result = match timeout {
            Some(t) => self.call_unit("wait", |o| o.call_method1("wait", (keys.to_vec(), t))),
            None => self.call_unit("wait", |o| o.call_method1("wait", (keys.to_vec(),))),
        };
        result.map_err(|err| match err {
            Error::Timeout { .. } => {
                Error::wait_timeout("wait", timeout.unwrap_or_else(|| self.timeout()), keys)
            }
            other => other,
        })
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.call(
            "delete_key",
            |o| o.call_method1("delete_key", (key,)),
            |r| r.extract(),
        )
    }

    fn num_keys(&self) -> Result<i64> {
        self.call("num_keys", |o| o.call_method0("num_keys"), |r| r.extract())
    }

    fn timeout(&self) -> Duration {
        self.call("timeout", |o| o.getattr("timeout"), |r| r.extract())
            .unwrap_or(crate::store::DEFAULT_TIMEOUT)
    }

    fn set_timeout(&self, timeout: Duration) {
        // A store that refuses a new timeout keeps its old one; there is no error to report.
        let _ = self.call_unit("set_timeout", |o| o.call_method1("set_timeout", (timeout,)));
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        let object = self.call(
            "clone",
            |o| o.call_method0("clone"),
            |r| Ok(r.clone().unbind()),
        )?;
        Ok(Arc::new(ForeignStore::new(object)))
    }

    fn has_extended_api(&self) -> bool {
        self.call(
            "has_extended_api",
            |o| o.call_method0("has_extended_api"),
            |r| r.extract(),
        )
        .unwrap_or(false)
    }

    fn sliceable_waits(&self) -> bool {
        false
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call_unit("append", |o| {
            o.call_method1("append", (key, PyBytes::new(o.py(), value)))
        })
    }

    fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>> {
        self.call(
            "multi_get",
            |o| o.call_method1("multi_get", (keys.to_vec(),)),
            |r| r.try_iter()?.map(|v| to_bytes(&v?)).collect(),
        )
    }

    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        self.call_unit("multi_set", |o| {
            let py = o.py();
            let values = PyList::new(py, values.iter().map(|v| PyBytes::new(py, v)))?;
            o.call_method1("multi_set", (keys.to_vec(), values))
        })
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call_unit("queue_push", |o| {
            o.call_method1("queue_push", (key, PyBytes::new(o.py(), value)))
        })
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        self.call(
            "queue_pop",
            |o| o.call_method1("queue_pop", (key, block)),
            to_bytes,
        )
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        self.call(
            "queue_len",
            |o| o.call_method1("queue_len", (key,)),
            |r| r.extract(),
        )
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        self.call(
            "list_keys",
            |o| o.call_method0("list_keys"),
            |r| r.extract(),
        )
    }

    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        self.call_unit("barrier", |o| {
            o.call_method1("barrier", (key, world_size, timeout))
        })
    }
}

/// Wraps any Python store (torch's or a user's) as a native store handle.
#[pyfunction]
pub fn wrap_store(store: Py<PyAny>) -> PyNativeStore {
    PyNativeStore::new(Arc::new(ForeignStore::new(store)))
}
