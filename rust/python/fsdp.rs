//! Bindings for [`crate::fsdp`]: the flat-parameter layout, as a read-only native object.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::errors::to_py;
use crate::fsdp::layout::{self, FlatParamLayout, ShardSlice};

/// torch's `_ShardParamInfo` fields as a tuple:
/// `(in_shard, offset_in_shard, numel_in_shard, intra_param_start_idx, intra_param_end_idx)`.
type InfoTuple = (bool, Option<u64>, Option<u64>, Option<u64>, Option<i64>);

fn info_tuple(slice: Option<ShardSlice>) -> InfoTuple {
    match slice {
        None => (false, None, None, None, None),
        Some(s) => (
            true,
            Some(s.offset_in_shard),
            Some(s.numel_in_shard),
            Some(s.intra_param_start_idx),
            Some(s.intra_param_end_idx),
        ),
    }
}

/// The planned layout of one FSDP flat parameter (see `ferrodist.fsdp._layout`).
#[pyclass(name = "FlatParamPlan", module = "ferrodist._native", frozen)]
pub struct PyFlatParamPlan(FlatParamLayout);

#[pymethods]
impl PyFlatParamPlan {
    #[getter]
    fn world_size(&self) -> u64 {
        self.0.world_size
    }
    #[getter]
    fn numels(&self) -> Vec<u64> {
        self.0.numels.clone()
    }
    #[getter]
    fn param_offsets(&self) -> Vec<u64> {
        self.0.param_offsets.clone()
    }
    #[getter]
    fn numels_with_padding(&self) -> Vec<u64> {
        self.0.numels_with_padding.clone()
    }
    #[getter]
    fn is_padding_mask(&self) -> Vec<bool> {
        self.0.is_padding_mask.clone()
    }
    #[getter]
    fn flat_numel(&self) -> u64 {
        self.0.flat_numel
    }
    #[getter]
    fn shard_numel(&self) -> u64 {
        self.0.shard_numel
    }
    #[getter]
    fn padded_unsharded_numel(&self) -> u64 {
        self.0.padded_unsharded_numel()
    }
    /// `[start, end)` of the flat parameter `rank` holds before its end padding.
    fn shard_range(&self, rank: i64) -> PyResult<(u64, u64)> {
        self.0.shard_range(rank).map_err(to_py)
    }
    /// Elements `rank` pads at the end of its shard.
    fn shard_padding(&self, rank: i64) -> PyResult<u64> {
        self.0.shard_padding(rank).map_err(to_py)
    }
    /// torch's `_shard_param_infos` of `rank` under a sharded strategy, as tuples.
    fn shard_param_infos(&self, rank: i64) -> PyResult<Vec<InfoTuple>> {
        let infos = self.0.shard_param_infos(rank).map_err(to_py)?;
        Ok(infos.into_iter().map(info_tuple).collect())
    }
    /// torch's `_shard_param_infos` under `NO_SHARD` (the whole flat parameter), as tuples.
    fn unsharded_param_infos(&self) -> Vec<InfoTuple> {
        self.0
            .unsharded_param_infos()
            .into_iter()
            .map(info_tuple)
            .collect()
    }
}

/// Converts argument `name`, naming it in the `TypeError` when its type is wrong.
fn argument<'py, T: FromPyObjectOwned<'py>>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<T> {
    value.extract::<T>().map_err(|err| {
        let err: PyErr = err.into();
        PyTypeError::new_err(format!("{name}: {}", err.value(value.py())))
    })
}

/// Plans the flat parameter of parameters with `numels` elements of `itemsize` bytes over
/// `world_size` ranks; `align_addresses` is torch's `use_orig_params`.
#[pyfunction]
#[pyo3(signature = (numels, itemsize, world_size, *, align_addresses))]
pub fn plan_flat_param(
    numels: &Bound<'_, PyAny>,
    itemsize: &Bound<'_, PyAny>,
    world_size: &Bound<'_, PyAny>,
    align_addresses: &Bound<'_, PyAny>,
) -> PyResult<PyFlatParamPlan> {
    let numels: Vec<i64> = argument("numels", numels)?;
    layout::plan_flat_param(
        &numels,
        argument("itemsize", itemsize)?,
        argument("world_size", world_size)?,
        argument("align_addresses", align_addresses)?,
    )
    .map(PyFlatParamPlan)
    .map_err(to_py)
}

/// Registers the FSDP planning functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFlatParamPlan>()?;
    m.add_function(wrap_pyfunction!(plan_flat_param, m)?)
}
