//! Bindings for [`crate::bucket`]: bucket assignment from tensors or from metadata arrays.
//!
//! The tensor entry point reads each tensor's metadata in one pass with the GIL held (three
//! attribute reads per tensor: `nbytes`, `dtype`, `device`), then runs the core with the GIL
//! released. `hash(device)` is torch's device bits, so no device attribute is read twice.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PySequence, PyTuple, PyType};

use super::blocking::detached;
use super::errors::to_py;
use crate::bucket::{
    assign_buckets, tensor_bytes, BucketAssignment, BucketRequest, GroupKey, TensorSize,
};
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
    /// The values, decoded in one pass; `f` converts each (and may fail naming its position).
    fn map<T>(&self, mut f: impl FnMut(usize, i64) -> PyResult<T>) -> PyResult<Vec<T>> {
        match self {
            IntArray::Packed(bytes) => bytes
                .as_bytes()
                .chunks_exact(8)
                .enumerate()
                .map(|(i, c)| f(i, i64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))))
                .collect(),
            IntArray::Sequence(values) => {
                values.iter().enumerate().map(|(i, &v)| f(i, v)).collect()
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            IntArray::Packed(bytes) => bytes.as_bytes().len() / 8,
            IntArray::Sequence(values) => values.len(),
        }
    }
}

/// A byte count: negative values are refused, naming the argument and position.
fn byte_count(name: &str, i: usize, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| {
        PyTypeError::new_err(format!(
            "{name}[{i}] = {v} is negative; it must be a byte count >= 0"
        ))
    })
}

/// Converts signed values to byte counts, naming the argument when one is negative.
fn non_negative(name: &str, values: &[i64]) -> PyResult<Vec<u64>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| byte_count(name, i, v))
        .collect()
}

/// Python ints `0..len`, shared by every result (ints are immutable): a bucket list then costs
/// one reference-count increment per index instead of one allocation, which is most of the
/// time of a large assignment. Grows to the largest tensor count seen; only used with the GIL.
static INDEX_POOL: PyOnceLock<Py<PyList>> = PyOnceLock::new();

fn index_pool(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyList>> {
    let pool = INDEX_POOL
        .get_or_init(py, || PyList::empty(py).unbind())
        .bind(py);
    if pool.len() < len {
        let range = py
            .import(intern!(py, "builtins"))?
            .getattr(intern!(py, "range"))?;
        pool.call_method1(intern!(py, "extend"), (range.call1((pool.len(), len))?,))?;
    }
    Ok(pool.clone())
}

fn to_python(py: Python<'_>, result: BucketAssignment) -> PyResult<Bound<'_, PyTuple>> {
    let needed = result
        .buckets
        .iter()
        .flatten()
        .max()
        .map_or(0, |&m| m as usize + 1);
    let pool = index_pool(py, needed)?;
    let buckets = result
        .buckets
        .iter()
        .map(|bucket| {
            let items = bucket
                .iter()
                .map(|&i| pool.get_item(i as usize))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let buckets = PyList::new(py, buckets)?;
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
    let n = sizes.len();
    if dtype_ids.len() != n || device_ids.len() != n {
        return Err(to_py(Error::InvalidArgument(format!(
            "sizes, dtype_ids and device_ids must have one entry per tensor, got {n}, {} and {}",
            dtype_ids.len(),
            device_ids.len()
        ))));
    }
    let sizes = sizes.map(|i, v| byte_count("sizes", i, v))?;
    let limits = non_negative("bucket_size_limits", &bucket_size_limits)?;
    let mut keys = dtype_ids.map(|_, dtype| Ok(GroupKey { dtype, device: 0 }))?;
    device_ids.map(|i, device| {
        keys[i].device = device;
        Ok(())
    })?;
    let indices = tensor_indices.map(|_, v| Ok(v))?;
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

/// Reads `(bytes, group key)` of every tensor, sized by [`tensor_bytes`]. `dtype_ids` maps each
/// `torch.dtype` to its id; `sparse_layout` is `torch.sparse_coo`.
fn read_metadata(
    tensors: &Bound<'_, PyAny>,
    tensor_type: &Bound<'_, PyAny>,
    dtype_ids: &Bound<'_, PyDict>,
    sparse_layout: &Bound<'_, PyAny>,
) -> PyResult<(Vec<u64>, Vec<GroupKey>)> {
    let py = tensors.py();
    let count = tensors.len()?;
    let (mut sizes, mut keys) = (Vec::with_capacity(count), Vec::with_capacity(count));
    // Models mix a few dtypes (float32, float16, bfloat16 ...), often in turn: a small cache
    // of the ids seen, compared by identity (dtypes are singletons), skips the dict lookup.
    let mut seen_dtypes: Vec<(Bound<'_, PyAny>, i64)> = Vec::with_capacity(4);
    // `tensor.device` allocates a torch.device per call; `is_cpu` is a plain bool getter, and
    // every CPU tensor has the same device id.
    let cpu_id = torch_device_hash(py, "cpu")?;
    // The exact types seen pass without `isinstance`, which goes through torch's metaclass.
    let mut tensor_types: Vec<Bound<'_, PyType>> = Vec::with_capacity(2);
    for (i, tensor) in tensors.try_iter()?.enumerate() {
        let tensor = tensor?;
        let ty = tensor.get_type();
        if !tensor_types.iter().any(|t| t.is(&ty)) {
            if !tensor.is_instance(tensor_type)? {
                return Err(PyTypeError::new_err(format!(
                    "tensors[{i}]: expected a torch.Tensor, got {}",
                    ty.name()?
                )));
            }
            if tensor_types.len() < 4 {
                tensor_types.push(ty);
            }
        }
        // Which facts to read is all that is decided here; torch's rules are the core's.
        let size = match tensor.getattr(intern!(py, "nbytes")) {
            Ok(n) => TensorSize::Bytes(n.extract()?),
            // Every sparse layout refuses `nbytes`.
            Err(_) if tensor.getattr(intern!(py, "layout"))?.is(sparse_layout) => {
                TensorSize::SparseCoo
            }
            Err(_) => TensorSize::OtherSparse {
                numel: tensor.call_method0(intern!(py, "numel"))?.extract()?,
                element_size: tensor
                    .call_method0(intern!(py, "element_size"))?
                    .extract()?,
            },
        };
        let nbytes = tensor_bytes(i, size).map_err(to_py)?;
        let dtype = tensor.getattr(intern!(py, "dtype"))?;
        let dtype_id = match seen_dtypes.iter().find(|(seen, _)| seen.is(&dtype)) {
            Some((_, id)) => *id,
            None => {
                let id: i64 = match dtype_ids.get_item(&dtype)? {
                    Some(id) => id.extract()?,
                    None => dtype.hash()? as i64,
                };
                if seen_dtypes.len() < 8 {
                    seen_dtypes.push((dtype, id));
                }
                id
            }
        };
        let device = if tensor.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
            cpu_id
        } else {
            tensor.getattr(intern!(py, "device"))?.hash()? as i64
        };
        sizes.push(nbytes);
        keys.push(GroupKey {
            dtype: dtype_id,
            device,
        });
    }
    Ok((sizes, keys))
}

/// `hash(torch.device(name))`: torch's device id.
fn torch_device_hash(py: Python<'_>, name: &str) -> PyResult<i64> {
    let device = py
        .import(intern!(py, "torch"))?
        .getattr(intern!(py, "device"))?
        .call1((name,))?;
    Ok(device.hash()? as i64)
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
