//! ferrodist: the pieces of `torch.distributed` that decide whether a job starts, scales and
//! survives, in Rust.
//!
//! The core never imports pyo3; the Python bindings live in [`python`] behind the `python`
//! feature, so `cargo test` and the `ferrodist-store` binary never link libpython.
//!
//! # Layout
//!
//! * [`error`]: the one [`Error`] enum and the [`Result`] alias.
//! * [`runtime`]: the one tokio runtime of the process, built lazily and rebuilt after `fork`.
//! * [`store`]: the [`store::Store`] trait (torch's Store API with deadlines) and the in-process
//!   stores: [`store::HashStore`], `FileStore` (torch's on-disk format), `PrefixStore`.
//! * [`bucket`]: DDP gradient bucket assignment (torch's `_compute_bucket_assignment_by_size`)
//!   from tensor metadata.
//! * `python` (feature `python`): PyO3 wrappers only: convert arguments, release the GIL, call
//!   the core, convert the result.
//! * [`partition`]: ZeRO's sorted-greedy parameter partition across ranks.

pub mod error;
pub mod runtime;
pub mod store;
// --- collectives ---
pub mod bucket;

// --- zero ---
pub mod partition;

#[cfg(feature = "python")]
pub mod python;

pub use error::{Error, Result};
