//! Bindings for [`crate::bucket`]: bucket assignment from tensors or from metadata arrays.
//!
//! The tensor entry point reads each tensor's metadata in one pass with the GIL held (three
//! attribute reads per tensor: `nbytes`, `dtype`, `device`), then runs the core with the GIL
//! released. `hash(device)` is torch's device bits, so no device attribute is read twice.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PySequence, PyTuple};

use super::blocking::detached;
use super::errors::to_py;
use crate::bucket::{assign_buckets, BucketAssignment, BucketRequest, GroupKey};
use crate::error::Error;

/// Integers given either as a sequence or packed as native-endian int64 bytes.
#[derive(FromPyObject)]
pub enum IntArray<'py> {
    /// int64 values packed by the Python layer (from numpy, torch or array.array).
    Packed(Bound<'py, PyBytes>),
    /// Any sequence of Python ints.
    Sequence(Vec<i64>),
}

impl IntArray<'_> {
    fn to_vec(&self) -> Vec<i64> {
        match self {
            IntArray::Packed(bytes) => bytes
                .as_bytes()
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            IntArray::Sequence(values) => values.clone(),
        }
    }
}

/// Converts signed values to byte counts, naming the argument when one is negative.
fn non_negative(name: &str, values: &[i64]) -> PyResult<Vec<u64>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            u64::try_from(v).map_err(|_| {
                PyTypeError::new_err(format!(
                    "{name}[{i}] = {v} is negative; it must be a byte count >= 0"
                ))
            })
        })
        .collect()
}

fn to_python(py: Python<'_>, result: BucketAssignment) -> PyResult<Bound<'_, PyTuple>> {
    let buckets = PyList::new(py, result.buckets)?;
    let limits = PyList::new(py, result.size_limits)?;
    PyTuple::new(py, [buckets.into_any(), limits.into_any()])
}

/// Bucket assignment from metadata: byte sizes, dtype ids and device ids, one per tensor.
#[pyfunction]
#[pyo3(signature = (sizes, dtype_ids, device_ids, bucket_size_limits, expect_sparse_gradient, tensor_indices))]
fn bucket_assignment_from_metadata<'py>(
    py: Python<'py>,
    sizes: IntArray<'_>,
    dtype_ids: IntArray<'_>,
    device_ids: IntArray<'_>,
    bucket_size_limits: Vec<i64>,
    expect_sparse_gradient: Vec<bool>,
    tensor_indices: IntArray<'_>,
) -> PyResult<Bound<'py, PyTuple>> {
    let sizes = non_negative("sizes", &sizes.to_vec())?;
    let limits = non_negative("bucket_size_limits", &bucket_size_limits)?;
    let (dtypes, devices) = (dtype_ids.to_vec(), device_ids.to_vec());
    if dtypes.len() != sizes.len() || devices.len() != sizes.len() {
        return Err(PyValueError::new_err(format!(
            "sizes, dtype_ids and device_ids must have one entry per tensor, got {}, {} and {}",
            sizes.len(),
            dtypes.len(),
            devices.len()
        )));
    }
    let keys: Vec<GroupKey> = dtypes
        .iter()
        .zip(&devices)
        .map(|(&dtype, &device)| GroupKey { dtype, device })
        .collect();
    let indices = tensor_indices.to_vec();
    let result = detached(py, || {
        assign_buckets(&BucketRequest {
            sizes: &sizes,
            keys: &keys,
            limits: &limits,
            expect_sparse_gradient: &expect_sparse_gradient,
            tensor_indices: &indices,
        })
    })?;
    to_python(py, result)
}

/// Reads `(nbytes, group key)` of every tensor. `dtype_ids` maps each `torch.dtype` to its id;
/// `sparse_layout` is `torch.sparse_coo`, the one layout torch refuses.
fn read_metadata(
    tensors: &Bound<'_, PyAny>,
    tensor_type: &Bound<'_, PyAny>,
    dtype_ids: &Bound<'_, PyDict>,
    sparse_layout: &Bound<'_, PyAny>,
) -> PyResult<(Vec<u64>, Vec<GroupKey>)> {
    let py = tensors.py();
    let count = tensors.len()?;
    let (mut sizes, mut keys) = (Vec::with_capacity(count), Vec::with_capacity(count));
    let mut last_dtype: Option<(Bound<'_, PyAny>, i64)> = None;
    for (i, tensor) in tensors.try_iter()?.enumerate() {
        let tensor = tensor?;
        if !tensor.is_instance(tensor_type)? {
            return Err(PyTypeError::new_err(format!(
                "tensors[{i}]: expected a torch.Tensor, got {}",
                tensor.get_type().name()?
            )));
        }
        let nbytes = match tensor.getattr(intern!(py, "nbytes")) {
            Ok(n) => n.extract::<u64>()?,
            // `nbytes` refuses every sparse layout; torch refuses COO only and sizes the rest
            // as numel * element_size.
            Err(_) if tensor.getattr(intern!(py, "layout"))?.is(sparse_layout) => {
                return Err(to_py(Error::InvalidInput(format!(
                    "No support for sparse tensors. (tensors[{i}] is sparse)"
                ))));
            }
            Err(_) => {
                let numel: u64 = tensor.call_method0(intern!(py, "numel"))?.extract()?;
                let item: u64 = tensor
                    .call_method0(intern!(py, "element_size"))?
                    .extract()?;
                numel.saturating_mul(item)
            }
        };
        let dtype = tensor.getattr(intern!(py, "dtype"))?;
        let dtype_id = match &last_dtype {
            Some((seen, id)) if seen.is(&dtype) => *id,
            _ => {
                let id: i64 = match dtype_ids.get_item(&dtype)? {
                    Some(id) => id.extract()?,
                    None => dtype.hash()? as i64,
                };
                last_dtype = Some((dtype, id));
                id
            }
        };
        let device = tensor.getattr(intern!(py, "device"))?.hash()? as i64;
        sizes.push(nbytes);
        keys.push(GroupKey {
            dtype: dtype_id,
            device,
        });
    }
    Ok((sizes, keys))
}

/// Bucket assignment from tensors (torch's signature, metadata only; data is never read).
#[pyfunction]
#[pyo3(signature = (tensors, bucket_size_limits, expect_sparse_gradient, tensor_indices, dtype_ids))]
fn bucket_assignment_of_tensors<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyAny>,
    bucket_size_limits: Vec<i64>,
    expect_sparse_gradient: Vec<bool>,
    tensor_indices: Vec<i64>,
    dtype_ids: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyTuple>> {
    if tensors.cast::<PySequence>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "tensors: expected a sequence of torch.Tensor, got {}",
            tensors.get_type().name()?
        )));
    }
    let limits = non_negative("bucket_size_limits", &bucket_size_limits)?;
    let torch = py.import(intern!(py, "torch"))?;
    let tensor_type = torch.getattr(intern!(py, "Tensor"))?;
    let sparse_layout = torch.getattr(intern!(py, "sparse_coo"))?;
    let (sizes, keys) = read_metadata(tensors, &tensor_type, dtype_ids, &sparse_layout)?;
    let result = detached(py, || {
        assign_buckets(&BucketRequest {
            sizes: &sizes,
            keys: &keys,
            limits: &limits,
            expect_sparse_gradient: &expect_sparse_gradient,
            tensor_indices: &tensor_indices,
        })
    })?;
    to_python(py, result)
}

/// Adds the bucket functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(bucket_assignment_from_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(bucket_assignment_of_tensors, m)?)?;
    Ok(())
}
