//! Binding for [`crate::ddp_iteration`]: the plan of a DDP Reducer's iteration.
//!
//! `on_gradient` runs once per parameter tensor per backward, so it converts nothing but an
//! index and a small tuple. [`PyGradientHook`] goes one step further: registered as the
//! parameter's post-accumulate-grad hook itself, it reports the gradient without running any
//! Python, and calls into Python only when the plan says there is work (a bucket to launch, a
//! large gradient to copy). A Python hook costs about 1 µs more per gradient, on every one of
//! the thousands of gradients of a real model.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyWeakrefReference};
use pyo3::{PyTraverseError, PyVisit};

use super::errors::to_py;
use crate::ddp_iteration::{DdpIteration, Launch, Settings};

/// A launch as Python sees it: `(from, to, finish, reduce_used_map)`.
type LaunchTuple = (usize, usize, bool, bool);

fn to_tuple(launch: Launch) -> LaunchTuple {
    (
        launch.from,
        launch.to,
        launch.finish,
        launch.reduce_used_map,
    )
}

/// The plan of a DDP Reducer's iterations: what to copy, launch and finish, and when.
///
/// Args:
///     buckets (list[list[int]]): the parameter indices of each bucket, in launch order.
///     copy_on_arrival (list[bool]): per parameter, whether its gradient is copied into its
///         bucket the moment it arrives.
///     find_unused (bool): DDP's `find_unused_parameters`.
///     skip_unused (bool): DDP's `skip_all_reduce_unused_params`.
///
/// Raises:
///     ValueError: when the buckets do not name every parameter index exactly once.
#[pyclass(name = "DdpIteration", module = "ferrodist._native")]
pub struct PyDdpIteration {
    inner: DdpIteration,
}

#[pymethods]
impl PyDdpIteration {
    #[new]
    #[pyo3(signature = (buckets, copy_on_arrival, *, find_unused, skip_unused))]
    fn new(
        buckets: Vec<Vec<usize>>,
        copy_on_arrival: Vec<bool>,
        find_unused: bool,
        skip_unused: bool,
    ) -> PyResult<Self> {
        let settings = Settings {
            find_unused,
            skip_unused,
        };
        let inner = DdpIteration::new(buckets, settings, copy_on_arrival).map_err(to_py)?;
        Ok(PyDdpIteration { inner })
    }

    /// Replaces the bucket layout; the iteration starts over.
    fn set_buckets(&mut self, buckets: Vec<Vec<usize>>) -> PyResult<()> {
        self.inner.set_buckets(buckets).map_err(to_py)
    }

    /// The arrival order to rebuild the buckets in, when due; else None.
    fn rebuild_order(&mut self) -> Option<Vec<usize>> {
        self.inner.rebuild_order()
    }

    /// Installs the rebuilt layout (buckets are rebuilt once).
    fn rebuilt(&mut self, buckets: Vec<Vec<usize>>) -> PyResult<()> {
        self.inner.rebuilt(buckets).map_err(to_py)
    }

    /// Replaces the recorded rebuild order.
    fn set_rebuild_order(&mut self, indices: Vec<usize>) {
        self.inner.set_rebuild_order(indices);
    }

    /// Declares the graph static; False once a forward pass ran.
    fn set_static_graph(&mut self) -> bool {
        self.inner.set_static_graph()
    }

    /// A forward pass starts.
    fn begin_forward(&mut self) {
        self.inner.begin_forward();
    }

    /// Whether `begin_backward` uses the unused parameters.
    fn searches_unused(&self) -> bool {
        self.inner.searches_unused()
    }

    /// Arms the hooks for the next backward.
    fn begin_backward(&mut self, unused: Vec<usize>) {
        self.inner.begin_backward(unused);
    }

    /// Parameter `index`'s gradient arrived: `(copy_now, launch)`, where `launch` is
    /// `(from, to, finish, reduce_used_map)` or None.
    ///
    /// Raises:
    ///     ValueError: when the gradient already arrived in this iteration.
    fn on_gradient(&mut self, index: usize) -> PyResult<(bool, Option<LaunchTuple>)> {
        let report = self.inner.on_gradient(index).map_err(to_py)?;
        Ok((report.copy_now, report.launch.map(to_tuple)))
    }

    /// Backward ended with every bucket launched.
    fn end_of_backward(&mut self) {
        self.inner.end_of_backward();
    }

    /// Static graph's first iteration: every bucket at once, as `(from, to)`, or None.
    fn reduce_all_at_end(&mut self) -> Option<(usize, usize)> {
        self.inner.reduce_all_at_end()
    }

    /// Whether bucket `bucket` stays out of this iteration's reduction.
    fn skips(&self, bucket: usize) -> bool {
        self.inner.skips(bucket)
    }

    /// The reduction of this iteration is over.
    fn finish_backward(&mut self) {
        self.inner.finish_backward();
    }

    /// Forgets the iteration under way.
    fn reset(&mut self) {
        self.inner.reset();
    }

    /// The parameters still missing when a reduction is under way; else None.
    fn unfinished(&self) -> Option<Vec<usize>> {
        self.inner.unfinished()
    }

    /// Whether some parameter may have been unused on some rank in this iteration.
    fn may_have_unused(&self) -> bool {
        self.inner.may_have_unused()
    }

    /// Whether every forward so far used every parameter.
    fn graph_static(&self) -> bool {
        self.inner.graph_static()
    }

    /// Forward passes so far.
    #[getter]
    fn iterations(&self) -> u64 {
        self.inner.iterations()
    }

    /// The parameters counted as unused.
    #[getter]
    fn unused(&self) -> Vec<usize> {
        self.inner.unused().to_vec()
    }

    /// Buckets reduced in this iteration.
    #[getter]
    fn buckets_reduced(&self) -> usize {
        self.inner.buckets_reduced()
    }

    /// Whether the one-time rebuild happened.
    #[getter]
    fn has_rebuilt(&self) -> bool {
        self.inner.has_rebuilt()
    }

    /// Whether the graph was declared static.
    #[getter]
    fn static_graph(&self) -> bool {
        self.inner.static_graph()
    }

    /// Parameters in the order their gradients arrived in the last backward.
    fn arrival_order(&self) -> Vec<usize> {
        self.inner.arrival_order().to_vec()
    }

    /// The local used map as native-endian int32 bytes, one per parameter.
    fn used_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let bytes: Vec<u8> = self
            .inner
            .used()
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        PyBytes::new(py, &bytes)
    }
}

/// One parameter's post-accumulate-grad hook: reports the gradient to a [`PyReadiness`].
///
/// Args:
///     plan (DdpIteration): the Reducer's plan.
///     index (int): the parameter's index in it.
///     owner (object): the Reducer, held weakly and passed first to each callback.
///     launch (Callable[[object, int, int, bool, bool], None]): called with
///         `(owner, from, to, finish, reduce_used_map)` when buckets `from..to` may launch.
///     ready_twice (Callable[[object, int], BaseException]): builds the error raised when the
///         gradient already arrived in this iteration.
///     copy (Callable[[object, int, Tensor], None]): called with `(owner, index, param)`
///         before any launch when the plan says to copy the gradient now.
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
    plan: Py<PyDdpIteration>,
    owner: Py<PyWeakrefReference>,
    launch: Py<PyAny>,
    ready_twice: Py<PyAny>,
    copy: Py<PyAny>,
}

#[pymethods]
impl PyGradientHook {
    #[new]
    #[pyo3(signature = (plan, index, owner, *, launch, ready_twice, copy))]
    fn new(
        plan: Py<PyDdpIteration>,
        index: usize,
        owner: &Bound<'_, PyAny>,
        launch: Py<PyAny>,
        ready_twice: Py<PyAny>,
        copy: Py<PyAny>,
    ) -> PyResult<Self> {
        let callbacks = HookCallbacks {
            plan,
            owner: PyWeakrefReference::new(owner)?.unbind(),
            launch,
            ready_twice,
            copy,
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
        // the borrow ends before any callback, which may read the plan again
        let reported = callbacks
            .plan
            .try_borrow_mut(py)?
            .inner
            .on_gradient(self.index);
        let Ok(report) = reported else {
            let error = callbacks.ready_twice.bind(py).call1((owner, self.index))?;
            return Err(PyErr::from_value(error));
        };
        if report.copy_now {
            callbacks.copy.bind(py).call1((&owner, self.index, param))?;
        }
        if let Some(launch) = report.launch {
            let (from, to, finish, reduce_used_map) = to_tuple(launch);
            callbacks
                .launch
                .bind(py)
                .call1((owner, from, to, finish, reduce_used_map))?;
        }
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(callbacks) = &self.callbacks {
            visit.call(&callbacks.plan)?;
            visit.call(&callbacks.owner)?;
            visit.call(&callbacks.launch)?;
            visit.call(&callbacks.ready_twice)?;
            visit.call(&callbacks.copy)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.callbacks = None;
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDdpIteration>()?;
    m.add_class::<PyGradientHook>()
}
