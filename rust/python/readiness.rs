//! Binding for [`crate::readiness`]: the DDP Reducer's per-gradient bookkeeping.
//!
//! `on_hook` runs once per parameter tensor per backward, so it converts nothing but an index
//! and a small tuple. [`PyGradientHook`] goes one step further: registered as the parameter's
//! post-accumulate-grad hook itself, it reports the gradient without running any Python, and
//! calls into Python only when there is work (a bucket to launch, a large gradient to copy).
//! A Python hook costs a frame and a call into this module on every one of the thousands of
//! gradients of a real model; this one costs a method call from autograd.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyWeakrefReference};
use pyo3::{PyTraverseError, PyVisit};

use super::errors::to_py;
use crate::readiness::{self, Mode, Ready};

/// Which parameters and buckets of a DDP Reducer are ready in the current backward.
///
/// Args:
///     param_count (int): number of parameters of the Reducer.
///     buckets (list[list[int]]): the parameter indices of each bucket, in launch order.
///
/// Raises:
///     ValueError: when the buckets do not name every parameter index exactly once.
#[pyclass(name = "Readiness", module = "ferrodist._native")]
pub struct PyReadiness {
    inner: readiness::Readiness,
}

fn to_tuple(ready: Ready) -> Option<(usize, usize, bool)> {
    match ready {
        Ready::Nothing => None,
        Ready::Launch {
            from,
            to,
            all_launched,
        } => Some((from, to, all_launched)),
    }
}

#[pymethods]
impl PyReadiness {
    #[new]
    fn new(param_count: usize, buckets: Vec<Vec<usize>>) -> PyResult<Self> {
        let inner = readiness::Readiness::new(param_count, &buckets).map_err(to_py)?;
        Ok(PyReadiness { inner })
    }

    /// Replaces the bucket layout (after the rebuild) and resets the iteration.
    fn set_buckets(&mut self, buckets: Vec<Vec<usize>>) -> PyResult<()> {
        self.inner.set_buckets(&buckets).map_err(to_py)
    }

    /// Starts an iteration; `unused` parameters are marked ready on the first hook.
    #[pyo3(signature = (*, armed, record_used, count_only, use_hook_counts, record_rebuild, unused))]
    fn arm(
        &mut self,
        armed: bool,
        record_used: bool,
        count_only: bool,
        use_hook_counts: bool,
        record_rebuild: bool,
        unused: Vec<usize>,
    ) {
        let mode = Mode {
            armed,
            record_used,
            count_only,
            use_hook_counts,
            record_rebuild,
        };
        self.inner.arm(mode, unused);
    }

    /// Forgets this iteration's readiness and ignores hooks until the next `arm`.
    fn reset(&mut self) {
        self.inner.reset();
    }

    /// Parameter `index`'s hook fired: `(from, to, all_launched)` when buckets `from..to` may
    /// launch now, else None.
    ///
    /// Raises:
    ///     ValueError: when the parameter is already ready in this iteration.
    fn on_hook(&mut self, index: usize) -> PyResult<Option<(usize, usize, bool)>> {
        self.inner.on_hook(index).map(to_tuple).map_err(to_py)
    }

    /// Marks every remaining parameter ready: the buckets to launch, as `on_hook` returns them.
    fn mark_all(&mut self) -> Option<(usize, usize, bool)> {
        to_tuple(self.inner.mark_all())
    }

    /// Whether a reduction is under way (some parameter is ready).
    fn any_ready(&self) -> bool {
        self.inner.any_ready()
    }

    /// Parameters not ready in this iteration, ascending.
    fn not_ready(&self) -> Vec<usize> {
        self.inner.not_ready()
    }

    /// Parameters in the order their hooks fired in this iteration.
    fn arrival_order(&self) -> Vec<usize> {
        self.inner.arrival_order().to_vec()
    }

    /// Appends parameters to the rebuild order.
    fn extend_rebuild_order(&mut self, indices: Vec<usize>) {
        self.inner.extend_rebuild_order(&indices);
    }

    /// Replaces the rebuild order.
    fn set_rebuild_order(&mut self, indices: Vec<usize>) {
        self.inner.set_rebuild_order(indices);
    }

    /// The rebuild order recorded so far; leaves it empty.
    fn take_rebuild_order(&mut self) -> Vec<usize> {
        self.inner.take_rebuild_order()
    }

    /// Length of the rebuild order recorded so far.
    fn rebuild_order_len(&self) -> usize {
        self.inner.rebuild_order_len()
    }

    /// The local used map as native-endian int32 bytes, one per parameter.
    fn used_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let used = self.inner.used();
        let bytes: Vec<u8> = used.iter().flat_map(|v| v.to_ne_bytes()).collect();
        PyBytes::new(py, &bytes)
    }

    /// Clears the local used map.
    fn clear_used(&mut self) {
        self.inner.clear_used();
    }

    /// Parameters whose hook never fired in static graph's first iteration.
    fn never_hooked(&self) -> Vec<usize> {
        self.inner.never_hooked()
    }
}

/// One parameter's post-accumulate-grad hook: reports the gradient to a [`PyReadiness`].
///
/// Args:
///     readiness (Readiness): the Reducer's bookkeeping.
///     index (int): the parameter's index in it.
///     owner (object): the Reducer, held weakly and passed first to each callback.
///     launch (Callable[[object, int, int, bool], None]): called with
///         `(owner, from, to, all_launched)` when buckets `from..to` may launch.
///     ready_twice (Callable[[object, int], BaseException]): builds the error raised when the
///         parameter is already ready in this iteration.
///     on_arrival (Callable[[object, int, Tensor], None] | None): called with
///         `(owner, index, param)` on every report before any launch (the Reducer copies large
///         gradients as they arrive).
///
/// The hook lives on a parameter the Reducer itself holds, and torch keeps a tensor's hooks
/// where the garbage collector cannot see them: a strong reference back to the Reducer would
/// be a cycle never collected, keeping every dropped DDP's parameters and buckets in memory.
/// So the owner is held weakly, and the hook reports nothing once it is gone.
#[pyclass(name = "GradientHook", module = "ferrodist._native")]
pub struct PyGradientHook {
    index: usize,
    /// `None` once the garbage collector cleared the hook.
    callbacks: Option<HookCallbacks>,
}

struct HookCallbacks {
    readiness: Py<PyReadiness>,
    owner: Py<PyWeakrefReference>,
    launch: Py<PyAny>,
    ready_twice: Py<PyAny>,
    on_arrival: Option<Py<PyAny>>,
}

#[pymethods]
impl PyGradientHook {
    #[new]
    #[pyo3(signature = (readiness, index, owner, *, launch, ready_twice, on_arrival=None))]
    fn new(
        readiness: Py<PyReadiness>,
        index: usize,
        owner: &Bound<'_, PyAny>,
        launch: Py<PyAny>,
        ready_twice: Py<PyAny>,
        on_arrival: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let callbacks = HookCallbacks {
            readiness,
            owner: PyWeakrefReference::new(owner)?.unbind(),
            launch,
            ready_twice,
            on_arrival,
        };
        Ok(PyGradientHook {
            index,
            callbacks: Some(callbacks),
        })
    }

    fn __call__(&self, py: Python<'_>, param: Bound<'_, PyAny>) -> PyResult<()> {
        let Some(callbacks) = &self.callbacks else {
            return Ok(()); // cleared by the garbage collector
        };
        let Some(owner) = callbacks.owner.bind(py).upgrade() else {
            return Ok(()); // the Reducer is gone: nothing to report to
        };
        // the borrow ends before any callback, which may read the readiness again
        let reported = callbacks
            .readiness
            .try_borrow_mut(py)?
            .inner
            .on_hook(self.index);
        let Ok(ready) = reported else {
            let error = callbacks.ready_twice.bind(py).call1((owner, self.index))?;
            return Err(PyErr::from_value(error));
        };
        if let Some(on_arrival) = &callbacks.on_arrival {
            on_arrival.bind(py).call1((&owner, self.index, param))?;
        }
        if let Some((from, to, all_launched)) = to_tuple(ready) {
            callbacks
                .launch
                .bind(py)
                .call1((owner, from, to, all_launched))?;
        }
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(callbacks) = &self.callbacks {
            visit.call(&callbacks.readiness)?;
            visit.call(&callbacks.owner)?;
            visit.call(&callbacks.launch)?;
            visit.call(&callbacks.ready_twice)?;
            if let Some(on_arrival) = &callbacks.on_arrival {
                visit.call(on_arrival)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.callbacks = None;
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyReadiness>()?;
    m.add_class::<PyGradientHook>()
}
