//! `NativeStore`: one Python handle over any core [`Store`], plus the store factories.
//!
//! The public classes (`ferrodist.HashStore`, ...) are Python subclasses of
//! `torch.distributed.Store` that delegate here, so torch accepts them wherever it takes a store.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDelta, PyDeltaAccess, PyFloat, PyInt, PyString};

use super::blocking::{detached, detached_interruptible, quick};
use super::errors::to_py;
use crate::error::Error;
use crate::store::{blocking, HashStore, Store};

/// The UTF-8 text of a `str`. One that cannot be encoded (a lone surrogate) is a `TypeError`,
/// the class torch's argument conversion raises, rather than a `UnicodeEncodeError`.
fn utf8<'a>(text: &'a Bound<'_, PyString>, what: &str) -> PyResult<std::borrow::Cow<'a, str>> {
    text.to_cow().map_err(|err| {
        PyTypeError::new_err(format!(
            "a store {what} must be encodable as UTF-8: {}",
            err.value(text.py())
        ))
    })
}

/// A value as torch accepts it: `bytes` or `str` (encoded as UTF-8).
///
/// Checked by type rather than by trying each conversion in turn: a failed attempt builds a
/// Python exception, which made `set("k", "v")` several times slower.
pub struct Value(Vec<u8>);

impl Value {
    /// The bytes to store.
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Value {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(text) = obj.cast::<PyString>() {
            return Ok(Value(utf8(&text, "value")?.as_bytes().to_vec()));
        }
        if let Ok(bytes) = obj.cast::<PyBytes>() {
            return Ok(Value(bytes.as_bytes().to_vec()));
        }
        Err(PyTypeError::new_err(format!(
            "expected str or bytes, got {}",
            obj.get_type().name()?
        )))
    }
}

/// A key as torch accepts it: `str`, or `bytes` holding UTF-8 text.
///
/// torch's pybind layer takes either for its `std::string` keys; ferrodist's core keys are text,
/// so bytes that are not UTF-8 are refused with a `ValueError` rather than altered.
pub struct Key(String);

impl Key {
    /// Every key of a list, as strings.
    pub fn strings(keys: Vec<Key>) -> Vec<String> {
        keys.into_iter().map(|k| k.0).collect()
    }
}

impl std::ops::Deref for Key {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Key {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(text) = obj.cast::<PyString>() {
            return Ok(Key(utf8(&text, "key")?.into_owned()));
        }
        if let Ok(bytes) = obj.cast::<PyBytes>() {
            return String::from_utf8(bytes.as_bytes().to_vec())
                .map(Key)
                .map_err(|_| {
                    to_py(Error::InvalidArgument(
                        "store keys must be UTF-8 text".into(),
                    ))
                });
        }
        Err(PyTypeError::new_err(format!(
            "a store key must be str or bytes, got {}",
            obj.get_type().name()?
        )))
    }
}

/// The `amount` of `add`: a Python int that fits in an `i64`, as torch's C++ takes it. One that
/// does not fit is a `TypeError` (torch's class), not pyo3's `OverflowError`.
pub struct Amount(i64);

impl<'a, 'py> FromPyObject<'a, 'py> for Amount {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if !obj.is_instance_of::<PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "add(): amount must be an int, got {}",
                obj.get_type().name()?
            )));
        }
        obj.extract::<i64>().map(Amount).map_err(|_| {
            let shown = obj.str().map_or_else(|_| "?".into(), |s| s.to_string());
            PyTypeError::new_err(format!(
                "add(): amount {shown} does not fit in a signed 64-bit integer"
            ))
        })
    }
}

/// A timeout as torch accepts it: `datetime.timedelta`, or a number of seconds.
///
/// A negative timeout is one that has already passed, as torch's HashStore treats it: a wait
/// with it fails at once with a store timeout if a key is missing (torch's TCPStore would hang).
pub struct Timeout {
    seconds: f64,
}

/// The longest timeout kept as given; longer ones (and infinity) are capped here so that a
/// deadline computed from them cannot overflow. A century is "forever" for a training job.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl<'a, 'py> FromPyObject<'a, 'py> for Timeout {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(delta) = obj.cast::<PyDelta>() {
            let seconds = f64::from(delta.get_days()) * 86_400.0
                + f64::from(delta.get_seconds())
                + f64::from(delta.get_microseconds()) / 1e6;
            return Ok(Timeout { seconds });
        }
        if obj.is_instance_of::<PyBool>()
            || !(obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>())
        {
            return Err(PyTypeError::new_err(format!(
                "timeout must be a datetime.timedelta or a number of seconds, got {}",
                obj.get_type().name()?
            )));
        }
        Ok(Timeout {
            seconds: obj.extract()?,
        })
    }
}

impl Timeout {
    /// The timeout as a `Duration`: negative is 1 ns (already passed), beyond a century is a
    /// century; NaN is refused.
    pub fn duration(&self) -> PyResult<Duration> {
        if self.seconds.is_nan() {
            return Err(to_py(Error::InvalidArgument(
                "timeout must be a number of seconds, got nan".into(),
            )));
        }
        if self.seconds < 0.0 {
            return Ok(Duration::from_nanos(1));
        }
        Ok(Duration::try_from_secs_f64(self.seconds)
            .unwrap_or(LONGEST_TIMEOUT)
            .min(LONGEST_TIMEOUT))
    }
}

fn timeout_or(store: &dyn Store, timeout: Option<Timeout>) -> PyResult<Duration> {
    timeout.map_or_else(|| Ok(store.timeout()), |t| t.duration())
}

/// A handle to a native store. Built by the factory functions, not directly.
#[pyclass(name = "NativeStore", module = "ferrodist._native", frozen)]
pub struct PyNativeStore {
    /// The core store behind this handle.
    pub inner: Arc<dyn Store>,
}

impl PyNativeStore {
    /// Wraps a core store.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        PyNativeStore { inner }
    }
}

#[pymethods]
impl PyNativeStore {
    /// Stores ``value`` (bytes or str) under ``key``.
    fn set(&self, py: Python<'_>, key: Key, value: Value) -> PyResult<()> {
        let value = value.into_vec();
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.set(&key, &value)
        })
    }

    /// Returns the value of ``key`` as bytes, waiting up to the store timeout for it.
    fn get(&self, py: Python<'_>, key: Key) -> PyResult<Vec<u8>> {
        if let Some(value) = self.inner.get_now(&key) {
            return Ok(value);
        }
        let timeout = self.inner.timeout();
        detached_interruptible(py, |interrupted| {
            blocking::get(&*self.inner, &key, timeout, interrupted)
        })
    }

    /// Adds ``amount`` to the integer under ``key`` and returns the new value.
    fn add(&self, py: Python<'_>, key: Key, amount: Amount) -> PyResult<i64> {
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.add(&key, amount.0)
        })
    }

    /// torch's compare-and-set; returns the value after the call.
    fn compare_set(
        &self,
        py: Python<'_>,
        key: Key,
        expected_value: Value,
        desired_value: Value,
    ) -> PyResult<Vec<u8>> {
        let (expected, desired) = (expected_value.into_vec(), desired_value.into_vec());
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.compare_set(&key, &expected, &desired)
        })
    }

    /// True iff every key is present now.
    fn check(&self, py: Python<'_>, keys: Vec<Key>) -> PyResult<bool> {
        let keys = Key::strings(keys);
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.check(&keys)
        })
    }

    /// Waits until every key is present, up to ``timeout`` (default: the store timeout).
    #[pyo3(signature = (keys, timeout=None))]
    fn wait(&self, py: Python<'_>, keys: Vec<Key>, timeout: Option<Timeout>) -> PyResult<()> {
        let keys = Key::strings(keys);
        let timeout = timeout_or(&*self.inner, timeout)?;
        detached_interruptible(py, |interrupted| {
            blocking::wait(&*self.inner, &keys, timeout, interrupted)
        })
    }

    /// Removes ``key``; True iff it existed.
    fn delete_key(&self, py: Python<'_>, key: Key) -> PyResult<bool> {
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.delete_key(&key)
        })
    }

    /// Number of keys, internal ones included.
    fn num_keys(&self, py: Python<'_>) -> PyResult<i64> {
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.num_keys()
        })
    }

    /// Appends ``value`` to ``key``.
    fn append(&self, py: Python<'_>, key: Key, value: Value) -> PyResult<()> {
        let value = value.into_vec();
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.append(&key, &value)
        })
    }

    /// Values of every key, waiting for them up to the store timeout.
    fn multi_get(&self, py: Python<'_>, keys: Vec<Key>) -> PyResult<Vec<Vec<u8>>> {
        let keys = Key::strings(keys);
        detached_interruptible(py, |interrupted| {
            blocking::multi_get(&*self.inner, &keys, interrupted)
        })
    }

    /// Sets each key to the matching value.
    fn multi_set(&self, py: Python<'_>, keys: Vec<Key>, values: Vec<Value>) -> PyResult<()> {
        let keys = Key::strings(keys);
        let values: Vec<Vec<u8>> = values.into_iter().map(Value::into_vec).collect();
        detached(py, || self.inner.multi_set(&keys, &values))
    }

    /// Pushes ``value`` onto the queue ``key``.
    fn queue_push(&self, py: Python<'_>, key: Key, value: Value) -> PyResult<()> {
        let value = value.into_vec();
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.queue_push(&key, &value)
        })
    }

    /// Pops the front of queue ``key``; with ``block``, waits up to the store timeout.
    #[pyo3(signature = (key, block=true))]
    fn queue_pop(&self, py: Python<'_>, key: Key, block: bool) -> PyResult<Vec<u8>> {
        if !block {
            return quick(py, self.inner.capabilities().in_memory, || {
                self.inner.queue_pop(&key, false)
            });
        }
        let timeout = self.inner.timeout();
        detached_interruptible(py, |interrupted| {
            blocking::queue_pop(&*self.inner, &key, timeout, interrupted)
        })
    }

    /// Length of queue ``key`` (0 if it does not exist).
    fn queue_len(&self, py: Python<'_>, key: Key) -> PyResult<i64> {
        quick(py, self.inner.capabilities().in_memory, || {
            self.inner.queue_len(&key)
        })
    }

    /// Every user-visible key.
    fn list_keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        detached(py, || self.inner.list_keys())
    }

    /// Blocks until ``world_size`` callers reach the barrier ``key``.
    #[pyo3(signature = (key, world_size, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        key: Key,
        world_size: i64,
        timeout: Option<Timeout>,
    ) -> PyResult<()> {
        let timeout = timeout_or(&*self.inner, timeout)?;
        detached(py, || self.inner.barrier(&key, world_size, Some(timeout)))
    }

    /// The default timeout of blocking calls.
    #[getter]
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    /// Sets the default timeout of blocking calls.
    fn set_timeout(&self, timeout: Timeout) -> PyResult<()> {
        self.inner.set_timeout(timeout.duration()?);
        Ok(())
    }

    /// A new handle to the same store.
    fn clone(&self, py: Python<'_>) -> PyResult<Self> {
        let inner = detached(py, || self.inner.clone_store())?;
        Ok(PyNativeStore { inner })
    }

    /// True when append/multi_get/multi_set are native.
    fn has_extended_api(&self) -> bool {
        self.inner.capabilities().extended_api
    }
}

/// A new in-process store (torch's ``HashStore``).
#[pyfunction]
fn hash_store() -> PyNativeStore {
    PyNativeStore::new(Arc::new(HashStore::new()))
}

/// Adds the store class and factories to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyNativeStore>()?;
    m.add_function(wrap_pyfunction!(hash_store, m)?)?;
    Ok(())
}
