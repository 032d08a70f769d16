//! A core [`Store`] over any Python store object (torch's `TCPStore`, `FileStore`, a user's
//! subclass), so core algorithms (PrefixStore, control collectives) run over stores ferrodist
//! did not build.
//!
//! Each call takes the GIL, calls the Python method and converts the result; Python exceptions
//! come back as the core error a native store would have raised, decided by exception class,
//! never by searching the message:
//!
//! * an interruption (`KeyboardInterrupt`, `SystemExit`: not an `Exception`) is parked and
//!   raised again unchanged when the call returns to Python;
//! * torch's `QueueEmptyError`, `NotImplementedError` (or a missing method),
//!   `DistNetworkError`, `TimeoutError` and `ValueError` map onto the matching core error, in
//!   that order;
//! * any other `RuntimeError` from a call that waits (get, wait, multi_get, a blocking
//!   queue_pop, barrier) is a timeout if, and only if, the call's timeout had passed when it
//!   raised. torch's stores raise their timeouts in that family (HashStore's and TCPStore's
//!   are `DistStoreError`, FileStore's `get` a plain `RuntimeError`), but also real failures
//!   (a store file that became a directory), so the class alone cannot tell them apart while
//!   the clock can, whatever the message says; everything else is a store error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{
    PyAttributeError, PyException, PyNotImplementedError, PyRuntimeError, PyTimeoutError,
    PyValueError,
};
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

    /// Calls the Python store; `waits` says how long the call may block, which decides whether
    /// a `RuntimeError` it raises is a timeout (see the module doc).
    fn call<T>(
        &self,
        op: &str,
        waits: Waits,
        call: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
        convert: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        Python::attach(|py| {
            let object = self.object.bind(py);
            let started = Instant::now();
            call(object)
                .and_then(|result| convert(&result))
                .map_err(|err| {
                    let timeout = match waits {
                        Waits::No => None,
                        Waits::For(timeout) => Some(timeout),
                        Waits::StoreTimeout => Some(store_timeout(object)),
                    };
                    let passed = timeout.filter(|&t| started.elapsed() + TIMEOUT_SLACK >= t);
                    from_python(py, op, err, passed)
                })
        })
    }

    fn call_unit(
        &self,
        op: &str,
        call: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
    ) -> Result<()> {
        self.call(op, Waits::No, call, |_| Ok(()))
    }
}

/// How long a foreign call may block before it fails with a timeout.
#[derive(Clone, Copy)]
enum Waits {
    /// Not at all (set, add, check, ...).
    No,
    /// Up to this timeout.
    For(Duration),
    /// Up to the store's own timeout, read only if the call fails.
    StoreTimeout,
}

/// How much earlier than its timeout a failed wait still counts as timed out: torch's TCPStore
/// waits whole milliseconds, and the clocks of two languages are read at different moments.
const TIMEOUT_SLACK: Duration = Duration::from_millis(5);

fn store_timeout(object: &Bound<'_, PyAny>) -> Duration {
    object
        .getattr("timeout")
        .and_then(|t| t.extract())
        .unwrap_or(crate::store::DEFAULT_TIMEOUT)
}

fn to_bytes(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    Ok(value.cast::<PyBytes>()?.as_bytes().to_vec())
}

/// Maps a Python exception from a foreign store onto the core error a native store would give
/// (see the module doc); `passed` is the timeout of a waiting call that failed after it.
fn from_python(py: Python<'_>, op: &str, err: PyErr, passed: Option<Duration>) -> Error {
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
        // Before the clock: a connection that broke as the wait ran out is still a network
        // failure.
        Error::Network(message)
    } else if value.is_instance_of::<PyTimeoutError>()
        || (passed.is_some() && value.is_instance_of::<PyRuntimeError>())
    {
        Error::Timeout {
            op: op.to_string(),
            after: passed.unwrap_or_default(),
            detail: message,
        }
    } else if value.is_instance_of::<PyValueError>() {
        Error::InvalidArgument(message)
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
        self.call(
            "get",
            Waits::StoreTimeout,
            |o| o.call_method1("get", (key,)),
            to_bytes,
        )
    }

    fn add(&self, key: &str, amount: i64) -> Result<i64> {
        self.call(
            "add",
            Waits::No,
            |o| o.call_method1("add", (key, amount)),
            |r| r.extract(),
        )
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.call(
            "compare_set",
            Waits::No,
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
            Waits::No,
            |o| o.call_method1("check", (keys.to_vec(),)),
            |r| r.extract(),
        )
    }

    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        let unit = |_: &Bound<'_, PyAny>| Ok(());
        let result = match timeout {
            Some(t) => self.call(
                "wait",
                Waits::For(t),
                |o| o.call_method1("wait", (keys.to_vec(), t)),
                unit,
            ),
            None => self.call(
                "wait",
                Waits::StoreTimeout,
                |o| o.call_method1("wait", (keys.to_vec(),)),
                unit,
            ),
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
            Waits::No,
            |o| o.call_method1("delete_key", (key,)),
            |r| r.extract(),
        )
    }

    fn num_keys(&self) -> Result<i64> {
        self.call(
            "num_keys",
            Waits::No,
            |o| o.call_method0("num_keys"),
            |r| r.extract(),
        )
    }

    fn timeout(&self) -> Duration {
        self.call(
            "timeout",
            Waits::No,
            |o| o.getattr("timeout"),
            |r| r.extract(),
        )
        .unwrap_or(crate::store::DEFAULT_TIMEOUT)
    }

    fn set_timeout(&self, timeout: Duration) {
        // A store that refuses a new timeout keeps its old one; there is no error to report.
        let _ = self.call_unit("set_timeout", |o| o.call_method1("set_timeout", (timeout,)));
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        let object = self.call(
            "clone",
            Waits::No,
            |o| o.call_method0("clone"),
            |r| Ok(r.clone().unbind()),
        )?;
        Ok(Arc::new(ForeignStore::new(object)))
    }

    fn has_extended_api(&self) -> bool {
        self.call(
            "has_extended_api",
            Waits::No,
            |o| o.call_method0("has_extended_api"),
            |r| r.extract(),
        )
        .unwrap_or(false)
    }

    fn interruptible_waits(&self) -> bool {
        false
    }

    fn bounds_writes(&self) -> bool {
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
            Waits::StoreTimeout,
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
            if block {
                Waits::StoreTimeout
            } else {
                Waits::No
            },
            |o| o.call_method1("queue_pop", (key, block)),
            to_bytes,
        )
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        self.call(
            "queue_len",
            Waits::No,
            |o| o.call_method1("queue_len", (key,)),
            |r| r.extract(),
        )
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        self.call(
            "list_keys",
            Waits::No,
            |o| o.call_method0("list_keys"),
            |r| r.extract(),
        )
    }

    fn barrier(&self, key: &str, world_size: i64, timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        self.call(
            "barrier",
            Waits::For(timeout),
            |o| o.call_method1("barrier", (key, world_size, timeout)),
            |_| Ok(()),
        )
    }
}

/// Wraps any Python store (torch's or a user's) as a native store handle.
#[pyfunction]
pub fn wrap_store(store: Py<PyAny>) -> PyNativeStore {
    PyNativeStore::new(Arc::new(ForeignStore::new(store)))
}
