//! Binding for [`crate::flight`]: the flight recorder, the diagnosis and dumps, as conversions
//! only.
//!
//! `record_tensors` and `completed` run on every collective, so they take the GIL-held fast
//! path: the core's critical section is one push under a mutex nobody holds while waiting on
//! anything, cheaper than releasing and re-taking the GIL. `record_tensors` converts an op's
//! strings and tensor metadata once per distinct value ([`SharedParts`]), so that recording
//! the ops of a job's steps copies and allocates nothing. Summaries, reports and dumps cross
//! as JSON strings, the form they are published in, stored in and read from files.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::fast::RandomState;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use smallvec::SmallVec;

use super::errors::to_py;
use crate::flight::{self, Dump, Entry, OpDescription, RankSummary, Recorder, TensorMeta};
use crate::Error;

/// The process's ring of recent collective and point-to-point ops.
///
/// Args:
///     capacity (int): how many ops it keeps (0 keeps none but still numbers them).
#[pyclass(name = "FlightRecorder", module = "ferrodist._native", frozen)]
pub struct PyFlightRecorder {
    ring: Recorder,
    parts: Mutex<SharedParts>,
}

/// The Rust form of the Python values that recorded ops share: the strings a caller passes
/// (group, op, call site, reduce op: each the same object op after op, from the caller's
/// caches), the dtypes, and each distinct set of tensor shapes and dtypes.
///
/// Strings and dtypes are found by identity, each kept alive by its entry (so that its address
/// cannot be another object's while it is here). Each table is bounded: when full it starts
/// afresh (the ring keeps what its ops share), so a job whose shapes never repeat pays one
/// conversion an op, as it did before, and holds no more than the bound.
#[derive(Default)]
struct SharedParts {
    strings: HashMap<usize, (Py<PyString>, Arc<str>), RandomState>,
    dtypes: Vec<(Py<PyAny>, String)>,
    tensors: HashMap<Box<[i64]>, Arc<TensorMeta>, RandomState>,
}

const STRINGS_KEPT: usize = 4096;
const DTYPES_KEPT: usize = 32;
const TENSOR_SETS_KEPT: usize = 4096;

/// Dimensions read from an op's tensors before its description is made; most ops have a few
/// tensors of a few dimensions, which fit without allocating.
type Dims = SmallVec<[i64; 32]>;

impl SharedParts {
    /// `text` as a shared string.
    fn string(&mut self, text: &Bound<'_, PyString>) -> PyResult<Arc<str>> {
        let key = text.as_ptr() as usize;
        if let Some((_, shared)) = self.strings.get(&key) {
            return Ok(Arc::clone(shared));
        }
        let shared: Arc<str> = text.to_cow()?.into();
        if self.strings.len() >= STRINGS_KEPT {
            self.strings.clear();
        }
        self.strings
            .insert(key, (text.clone().unbind(), Arc::clone(&shared)));
        Ok(shared)
    }

    /// Where `dtype` is in `dtypes`, if it is.
    fn dtype_index(&self, dtype: &Bound<'_, PyAny>) -> Option<usize> {
        self.dtypes.iter().position(|(seen, _)| seen.is(dtype))
    }
}

fn entry_dict<'py>(py: Python<'py>, e: &Entry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", e.id)?;
    d.set_item("group", &e.group)?;
    d.set_item("seq", e.seq)?;
    d.set_item("op", &e.op)?;
    d.set_item("shapes", &e.shapes)?;
    d.set_item("dtypes", &e.dtypes)?;
    d.set_item("reduce_op", &e.reduce_op)?;
    d.set_item("call_site", &e.call_site)?;
    d.set_item("state", e.state.as_str())?;
    d.set_item("issued_at_ms", e.issued_at_ms)?;
    d.set_item("started_at_ms", e.started_at_ms)?;
    d.set_item("completed_at_ms", e.completed_at_ms)?;
    d.set_item("error", &e.error)?;
    Ok(d)
}

#[pymethods]
impl PyFlightRecorder {
    #[new]
    fn new(capacity: usize) -> Self {
        PyFlightRecorder {
            ring: Recorder::new(capacity),
            parts: Mutex::default(),
        }
    }

    /// How many ops it keeps.
    #[getter]
    fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Records an op as issued now (`started`: and started, one call where there would be two
    /// on every op); returns `(id, seq)`.
    #[pyo3(signature = (group, op, shapes, dtypes, reduce_op, call_site, started=false))]
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        group: &str,
        op: String,
        shapes: Vec<Vec<i64>>,
        dtypes: Vec<String>,
        reduce_op: Option<String>,
        call_site: String,
        started: bool,
    ) -> (u64, u64) {
        let (id, seq) = self
            .ring
            .record(group, op, shapes, dtypes, reduce_op, call_site);
        if started {
            self.ring.started(id);
        }
        (id, seq)
    }

    /// Records an op on `tensors` (an iterable of tensors) as issued now (`started`: and
    /// started), reading each tensor's shape (none when `with_shapes` is false) and dtype here;
    /// returns its id. The per-op path: one call, where building the lists for `record` in
    /// Python cost more than the ring itself.
    #[pyo3(signature = (group, op, tensors, reduce_op, with_shapes, call_site, started))]
    #[allow(clippy::too_many_arguments)]
    fn record_tensors(
        &self,
        group: &Bound<'_, PyString>,
        op: &Bound<'_, PyString>,
        tensors: &Bound<'_, PyAny>,
        reduce_op: Option<&Bound<'_, PyString>>,
        with_shapes: bool,
        call_site: &Bound<'_, PyString>,
        started: bool,
    ) -> PyResult<u64> {
        // Read from Python first (attribute reads may run Python code), then convert under the
        // lock: per tensor its dtype's index, its rank and its dimensions, one flat key.
        let py = tensors.py();
        let mut key = Dims::new();
        let mut dtypes: SmallVec<[Bound<'_, PyAny>; 4]> = SmallVec::new();
        for tensor in tensors.try_iter()? {
            let tensor = tensor?;
            dtypes.push(tensor.getattr(intern!(py, "dtype"))?);
            key.push(0); // the dtype's index, filled in below
            if with_shapes {
                let at = key.len();
                key.push(0);
                push_shape(&tensor, &mut key)?;
                key[at] = (key.len() - at - 1) as i64;
            } else {
                key.push(0);
            }
        }
        let dtype_names = self.name_dtypes(&dtypes)?;
        let what = {
            let mut parts = self.parts();
            let mut at = 0;
            let mut known = true;
            for name in &dtype_names {
                match name {
                    DtypeName::Tabled(index) => key[at] = *index as i64,
                    DtypeName::Untabled(_) => known = false, // the table is full: not shared
                }
                at += 2 + key[at + 1] as usize;
            }
            let tensors = match parts.tensors.get(&key[..]) {
                Some(shared) if known => Arc::clone(shared),
                _ => {
                    let meta = Arc::new(tensor_meta(&key, &dtype_names, &parts));
                    if known {
                        if parts.tensors.len() >= TENSOR_SETS_KEPT {
                            parts.tensors.clear();
                        }
                        parts
                            .tensors
                            .insert(key.as_slice().into(), Arc::clone(&meta));
                    }
                    meta
                }
            };
            OpDescription {
                group: parts.string(group)?,
                op: parts.string(op)?,
                tensors,
                reduce_op: reduce_op.map(|r| parts.string(r)).transpose()?,
                call_site: parts.string(call_site)?,
            }
        };
        let (id, _seq) = self.ring.record_op(what);
        if started {
            self.ring.started(id);
        }
        Ok(id)
    }

    /// The backend started op `id` (unknown ids are ignored).
    fn started(&self, id: u64) {
        self.ring.started(id)
    }

    /// Op `id` finished successfully (unknown ids are ignored).
    fn completed(&self, id: u64) {
        self.ring.completed(id)
    }

    /// Op `id`, issued on a stand-in group (a receive from any source), turned out to be on
    /// `group` as `op`: it moves there with that group's next sequence number, which it
    /// returns (taken even when the ring no longer holds the op).
    fn moved(&self, id: u64, group: &str, op: &str) -> u64 {
        self.ring.moved(id, group, op)
    }

    /// Op `id` failed because of `why` (unknown ids are ignored).
    fn failed(&self, id: u64, why: &str) {
        self.ring.failed(id, why)
    }

    /// The ring, oldest first, one dict per op.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.ring
            .entries()
            .iter()
            .map(|e| entry_dict(py, e))
            .collect()
    }

    /// This rank's summary as JSON, with now as its heartbeat.
    fn summary_json(&self, rank: usize) -> String {
        self.ring.summary(rank, flight::now_ms()).to_json()
    }

    /// The dump file's text for this rank now.
    fn dump_json(&self, rank: usize, world_size: usize, reason: &str) -> String {
        Dump::of(&self.ring, rank, world_size, reason, flight::now_ms()).to_json()
    }
}

impl PyFlightRecorder {
    fn parts(&self) -> MutexGuard<'_, SharedParts> {
        // Each step under the lock is one insert or clear: a panic leaves usable tables.
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each of `dtypes` as its place in the table, named there (`str(dtype)` without its
    /// `torch.` prefix: `float32`, as the Python side names dtypes) if new and the table has
    /// room, else by its name. The table never shrinks, so a place stays valid. All Python runs
    /// outside the lock: it may switch threads, and another may then record.
    fn name_dtypes(&self, dtypes: &[Bound<'_, PyAny>]) -> PyResult<SmallVec<[DtypeName; 4]>> {
        let mut names = SmallVec::new();
        for dtype in dtypes {
            if let Some(index) = self.parts().dtype_index(dtype) {
                names.push(DtypeName::Tabled(index));
                continue;
            }
            let name = dtype_text(dtype)?;
            let mut parts = self.parts();
            // Another thread may have tabled it, or filled the table, meanwhile.
            names.push(match parts.dtype_index(dtype) {
                Some(index) => DtypeName::Tabled(index),
                None if parts.dtypes.len() < DTYPES_KEPT => {
                    parts.dtypes.push((dtype.clone().unbind(), name));
                    DtypeName::Tabled(parts.dtypes.len() - 1)
                }
                None => DtypeName::Untabled(name),
            });
        }
        Ok(names)
    }
}

/// Where an op's dtype is named: its place in [`SharedParts::dtypes`], or its own name when
/// the table is full.
enum DtypeName {
    Tabled(usize),
    Untabled(String),
}

/// Appends a tensor's dimensions: `torch.Size` is a tuple, read item by item without the
/// sequence protocol.
fn push_shape(tensor: &Bound<'_, PyAny>, out: &mut Dims) -> PyResult<()> {
    let shape = tensor.getattr(intern!(tensor.py(), "shape"))?;
    match shape.cast::<PyTuple>() {
        Ok(dims) => {
            for d in dims.iter() {
                out.push(d.extract::<i64>()?);
            }
        }
        Err(_) => out.extend(shape.extract::<Vec<i64>>()?),
    }
    Ok(())
}

/// The metadata that `key` (per tensor: dtype index, rank, dimensions) and the tensors'
/// `dtype_names` describe.
fn tensor_meta(key: &[i64], dtype_names: &[DtypeName], parts: &SharedParts) -> TensorMeta {
    let mut meta = TensorMeta::default();
    let mut at = 0;
    for name in dtype_names {
        let rank = key[at + 1] as usize;
        meta.shapes.push(key[at + 2..at + 2 + rank].to_vec());
        meta.dtypes.push(match name {
            DtypeName::Tabled(index) => parts.dtypes[*index].1.clone(),
            DtypeName::Untabled(name) => name.clone(),
        });
        at += 2 + rank;
    }
    meta
}

/// `str(dtype)` without its `torch.` prefix.
fn dtype_text(dtype: &Bound<'_, PyAny>) -> PyResult<String> {
    let text = dtype.str()?.to_string();
    Ok(text.strip_prefix("torch.").unwrap_or(&text).to_owned())
}

/// Diagnoses a job from its ranks' summaries (JSON); returns `(text, json)` of the report.
/// A heartbeat older than `heartbeat_timeout_s` (infinite: never) counts as gone.
#[pyfunction]
fn flight_diagnose(
    py: Python<'_>,
    summaries_json: Vec<String>,
    world_size: usize,
    heartbeat_timeout_s: f64,
) -> PyResult<(String, String)> {
    if heartbeat_timeout_s.is_nan() || heartbeat_timeout_s < 0.0 {
        return Err(to_py(Error::InvalidArgument(format!(
            "heartbeat_timeout_s must be >= 0, got {heartbeat_timeout_s}"
        ))));
    }
    // `as` saturates: infinity becomes u64::MAX.
    let timeout_ms = (heartbeat_timeout_s * 1000.0) as u64;
    py.detach(|| {
        let summaries = summaries_json
            .iter()
            .map(|s| RankSummary::from_json(s))
            .collect::<crate::Result<Vec<_>>>()?;
        let report = flight::diagnose(&summaries, world_size, flight::now_ms(), timeout_ms);
        Ok((report.to_string(), report.to_json()))
    })
    .map_err(to_py)
}

/// The summary (JSON) of the rank that wrote `dump_json`, as of its dump.
#[pyfunction]
fn flight_summary_from_dump(dump_json: &str) -> PyResult<String> {
    let dump = Dump::from_json(dump_json).map_err(to_py)?;
    Ok(RankSummary::from_dump(&dump).to_json())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFlightRecorder>()?;
    m.add_function(wrap_pyfunction!(flight_diagnose, m)?)?;
    m.add_function(wrap_pyfunction!(flight_summary_from_dump, m)?)?;
    Ok(())
}
