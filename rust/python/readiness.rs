//! Binding for [`crate::readiness`]: the DDP Reducer's per-gradient bookkeeping.
//!
//! `on_hook` runs once per parameter tensor per backward, so it converts nothing but an index
//! and a small tuple.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

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

/// Adds the class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyReadiness>()
}
