//! The calls of a Python store object (torch's `TCPStore`, `FileStore`, a user's subclass) for
//! the core's [`ForeignStore`], which gives them deadlines and decides what is a timeout.
//!
//! Each call takes the GIL, calls the Python method and converts the result; a Python
//! exception becomes a core error by its class, never by its message:
//!
//! * an interruption (`KeyboardInterrupt`, `SystemExit`: not an `Exception`) is parked and
//!   raised again unchanged when the call returns to Python;
//! * torch's `QueueEmptyError`, `NotImplementedError` (or a missing method),
//!   `DistNetworkError`, `TimeoutError` and `ValueError` map onto the matching core error, in
//!   that order;
//! * any other exception is [`Error::Store`], a failure its class does not name (the core
//!   tells a timeout among them by the clock).

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{
    PyAttributeError, PyException, PyNotImplementedError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::store::PyNativeStore;
use crate::error::{Error, Result};
use crate::store::foreign::{ForeignCalls, ForeignStore};

/// A Python `torch.distributed.Store`'s methods as [`ForeignCalls`].
pub struct PyStoreCalls {
    object: Py<PyAny>,
}

impl PyStoreCalls {
    /// Calls the Python store and converts the result, mapping an exception by class.
    fn call<T>(
        &self,
        op: &str,
        call: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
        convert: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        Python::attach(|py| {
            call(self.object.bind(py))
                .and_then(|result| convert(&result))
                .map_err(|err| from_python(py, op, err))
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

/// Maps a Python exception from a foreign store onto a core error by its class (see the
/// module doc).
fn from_python(py: Python<'_>, op: &str, err: PyErr) -> Error {
    let value = err.value(py);
    if !value.is_instance_of::<PyException>() {
        super::errors::park(err);
        return Error::Interrupted;
    }
    let message = value.to_string();
    let is_torch = |class: &str| -> bool {
        py.import("torch.distributed")
            .and_then(|m| m.getattr(class))
            .is_ok_and(|cls| value.is_instance(&cls).unwrap_or(false))
    };
    if is_torch("QueueEmptyError") {
        Error::QueueEmpty
    } else if value.is_instance_of::<PyNotImplementedError>()
        || value.is_instance_of::<PyAttributeError>()
    {
        Error::NotImplemented(message)
    } else if is_torch("DistNetworkError") {
        // Before the clock: a connection that broke as a wait ran out stays a network failure.
        Error::Network(message)
    } else if value.is_instance_of::<PyTimeoutError>() {
        Error::Timeout {
            op: op.to_string(),
            after: Duration::ZERO,
            detail: message,
        }
    } else if value.is_instance_of::<PyValueError>() {
        Error::InvalidArgument(message)
    } else {
        Error::Store(message)
    }
}

impl ForeignCalls for PyStoreCalls {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call_unit("set", |o| {
            o.call_method1("set", (key, PyBytes::new(o.py(), value)))
        })
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
        self.call_unit("wait", |o| match timeout {
            Some(t) => o.call_method1("wait", (keys.to_vec(), t)),
            None => o.call_method1("wait", (keys.to_vec(),)),
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

    fn timeout(&self) -> Result<Duration> {
        self.call("timeout", |o| o.getattr("timeout"), |r| r.extract())
    }

    fn set_timeout(&self, timeout: Duration) -> Result<()> {
        self.call_unit("set_timeout", |o| o.call_method1("set_timeout", (timeout,)))
    }

    fn clone_calls(&self) -> Result<Box<dyn ForeignCalls>> {
        let object = self.call(
            "clone",
            |o| o.call_method0("clone"),
            |r| Ok(r.clone().unbind()),
        )?;
        Ok(Box::new(PyStoreCalls { object }))
    }

    fn has_extended_api(&self) -> Result<bool> {
        self.call(
            "has_extended_api",
            |o| o.call_method0("has_extended_api"),
            |r| r.extract(),
        )
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

    fn barrier(&self, key: &str, world_size: i64, timeout: Duration) -> Result<()> {
        self.call_unit("barrier", |o| {
            o.call_method1("barrier", (key, world_size, timeout))
        })
    }
}

/// Wraps any Python store (torch's or a user's) as a native store handle.
#[pyfunction]
pub fn wrap_store(store: Py<PyAny>) -> PyNativeStore {
    let calls = Box::new(PyStoreCalls { object: store });
    PyNativeStore::new(Arc::new(ForeignStore::new(calls)))
}
