//! PyO3 bindings: the `ferrodist._native` extension module.
//!
//! Registration only. Each submodule wraps one core module and holds no logic of its own:
//! convert the arguments, release the GIL, call the core, convert the result.

mod blocking;
mod errors;
mod foreign_store;
mod rendezvous;
mod store;
// --- file and prefix stores ---
mod store_factories;
// --- tcp store ---
mod tcp_store;
// --- etcd store ---
mod etcd_store;
// --- collectives ---
mod bucket;
mod collectives;

// --- zero ---
mod partition;
// --- ddp ---
mod ddp_iteration;
// --- fsdp ---
mod fsdp;
// --- flight recorder ---
mod flight;

use pyo3::prelude::*;

/// The native half of the `ferrodist` package; the public API is the Python package itself.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    store::register(m)?;
    m.add_function(wrap_pyfunction!(foreign_store::wrap_store, m)?)?;
    // --- file and prefix stores ---
    store_factories::register(m)?;
    // --- tcp store ---
    tcp_store::register(m)?;
    // --- etcd store ---
    etcd_store::register(m)?;
    rendezvous::register(m)?;
    // --- zero ---
    m.add_function(wrap_pyfunction!(partition::sorted_greedy_partition, m)?)?;
    m.add_function(wrap_pyfunction!(partition::assign_ddp_buckets, m)?)?;
    // --- collectives ---
    bucket::register(m)?;
    collectives::register(m)?;
    // --- ddp ---
    ddp_iteration::register(m)?;
    // --- fsdp ---
    fsdp::register(m)?;
    // --- flight recorder ---
    flight::register(m)?;
    Ok(())
}
