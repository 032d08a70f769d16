//! Binding for [`crate::flight`]: the flight recorder, the diagnosis and dumps, as conversions
//! only.
//!
//! `record_tensors` and `completed` run on every collective, so they take the GIL-held fast
//! path: the core's critical section is one push under a mutex nobody holds while waiting on
//! anything, cheaper than releasing and re-taking the GIL. Summaries, reports and dumps cross as
//! JSON strings, the form they are published in, stored in and read from files.

use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::errors::to_py;
use crate::flight::{self, Dump, Entry, RankSummary, Recorder};
use crate::Error;

/// The process's ring of recent collective and point-to-point ops.
///
/// Args:
///     capacity (int): how many ops it keeps (0 keeps none but still numbers them).
#[pyclass(name = "FlightRecorder", module = "ferrodist._native", frozen)]
pub struct PyFlightRecorder(Recorder);

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
        PyFlightRecorder(Recorder::new(capacity))
    }

    /// How many ops it keeps.
    #[getter]
    fn capacity(&self) -> usize {
        self.0.capacity()
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
            .0
            .record(group, op, shapes, dtypes, reduce_op, call_site);
        if started {
            self.0.started(id);
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
        group: &str,
        op: &str,
        tensors: &Bound<'_, PyAny>,
        reduce_op: Option<&str>,
        with_shapes: bool,
        call_site: &str,
        started: bool,
    ) -> PyResult<u64> {
        let mut shapes = Vec::new();
        let mut dtypes = Vec::new();
        for tensor in tensors.try_iter()? {
            let tensor = tensor?;
            shapes.push(if with_shapes {
                shape_of(&tensor)?
            } else {
                Vec::new()
            });
            dtypes.push(dtype_name(&tensor.getattr(intern!(tensor.py(), "dtype"))?)?);
        }
        let (id, _seq) = self.record(
            group,
            op.to_owned(),
            shapes,
            dtypes,
            reduce_op.map(str::to_owned),
            call_site.to_owned(),
            started,
        );
        Ok(id)
    }

    /// The backend started op `id` (unknown ids are ignored).
    fn started(&self, id: u64) {
        self.0.started(id)
    }

    /// Op `id` finished successfully (unknown ids are ignored).
    fn completed(&self, id: u64) {
        self.0.completed(id)
    }

    /// Op `id`, issued on a stand-in group (a receive from any source), turned out to be on
    /// `group` as `op`: it moves there with that group's next sequence number, which it
    /// returns (taken even when the ring no longer holds the op).
    fn moved(&self, id: u64, group: &str, op: &str) -> u64 {
        self.0.moved(id, group, op)
    }

    /// Op `id` failed because of `why` (unknown ids are ignored).
    fn failed(&self, id: u64, why: &str) {
        self.0.failed(id, why)
    }

    /// The ring, oldest first, one dict per op.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.0.entries().iter().map(|e| entry_dict(py, e)).collect()
    }

    /// This rank's summary as JSON, with now as its heartbeat.
    fn summary_json(&self, rank: usize) -> String {
        self.0.summary(rank, flight::now_ms()).to_json()
    }

    /// The dump file's text for this rank now.
    fn dump_json(&self, rank: usize, world_size: usize, reason: &str) -> String {
        Dump::of(&self.0, rank, world_size, reason, flight::now_ms()).to_json()
    }
}

/// A tensor's shape: `torch.Size` is a tuple, read item by item without the sequence protocol.
fn shape_of(tensor: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let shape = tensor.getattr(intern!(tensor.py(), "shape"))?;
    match shape.cast::<PyTuple>() {
        Ok(dims) => dims.iter().map(|d| d.extract::<i64>()).collect(),
        Err(_) => shape.extract(),
    }
}

/// The dtypes named so far, each kept alive by its entry (so that its address cannot be
/// another object's while it is here); a few, since a process uses a few dtypes.
static DTYPE_NAMES: Mutex<Vec<(Py<PyAny>, String)>> = Mutex::new(Vec::new());
const DTYPE_NAMES_KEPT: usize = 32;

/// `str(dtype)` without its `torch.` prefix (`float32`), as the Python side names dtypes.
fn dtype_name(dtype: &Bound<'_, PyAny>) -> PyResult<String> {
    let names = || DTYPE_NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, name)) = names().iter().find(|(seen, _)| seen.is(dtype)) {
        return Ok(name.clone());
    }
    // Python runs outside the lock: it may switch threads, and another may then name a dtype.
    let text = dtype.str()?.to_string();
    let name = text.strip_prefix("torch.").unwrap_or(&text).to_owned();
    let mut names = names();
    if names.len() < DTYPE_NAMES_KEPT && !names.iter().any(|(seen, _)| seen.is(dtype)) {
        names.push((dtype.clone().unbind(), name.clone()));
    }
    Ok(name)
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
