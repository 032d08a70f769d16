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
//! * [`store`]: the [`store::Store`] trait (torch's Store API with deadlines);
//!   [`store::engine`], the one storage-engine interface (torch's TCP store operations, answered
//!   now or in flight) with two engines, the in-memory [`store::db`] (torch's differences
//!   between HashStore and the TCP server are a [`store::db::Policy`]; [`store::waiters`], its
//!   wait registry) and etcd ([`store::EtcdEngine`]); [`store::facade`], the one blocking
//!   `get` / `multi_get` / `wait` / `queue_pop` of [`store::HashStore`] and `EtcdStore` over
//!   their engines; the other stores: `FileStore` (torch's on-disk format), `PrefixStore`, and
//!   [`store::foreign`], a store ferrodist did not build (torch's, a user's), with each call's
//!   own deadline.
//! * [`tcp`]: torch's TCPStore wire protocol (codec), the tokio server behind `ferrodist-store`
//!   and the in-process master (one dispatcher from the wire to either engine; optional token
//!   auth, a connection cap and Prometheus metrics), and the client.
//! * [`bucket`]: DDP gradient bucket assignment (torch's `_compute_bucket_assignment_by_size`)
//!   from tensor metadata.
//! * [`collectives`]: control collectives over any store (torch's `_StoreCollectives`, same
//!   key layout, one deadline per call).
//! * `python` (feature `python`): PyO3 wrappers only: convert arguments, release the GIL, call
//!   the core, convert the result.
//! * [`partition`]: ZeRO's sorted-greedy parameter partition across ranks.
//! * [`rendezvous`]: a rank's rendezvous join over any store, with one request per progress
//!   report (Python only parses URLs and logs).
//! * [`ddp_iteration`]: the owner of a DDP iteration's state and decisions (static graph,
//!   unused parameters, rebuild, what to copy and launch as each gradient arrives), over
//!   [`readiness`], the per-gradient counting: which buckets may launch, arrival order, the
//!   local used map.
//! * [`fsdp`]: FSDP planning from metadata: the flat-parameter layout (padding, equal shards,
//!   each rank's parameter slices).
//! * [`flight`]: the flight recorder: a fixed-size ring of every collective and point-to-point
//!   op of the process, per-rank summaries, the hang diagnosis (behind, desync, gone), the
//!   versioned dump file, and the live view of a store's summaries that the store server
//!   shows on `GET /flight` and `GET /metrics`.
//!
//! Not part of this crate: `rust/protoc/`, a build helper that is a crate (and workspace) of
//! its own. It prints where the `protoc` vendored from crates.io is, for etcd-client's build
//! script, so that a source build needs no system protoc.

pub mod error;
pub mod runtime;
pub mod store;
// --- tcp store ---
pub mod tcp;
// --- collectives ---
pub mod bucket;
pub mod collectives;
pub mod rendezvous;

// --- zero ---
pub mod partition;

// --- ddp ---
pub mod ddp_iteration;
pub mod readiness;

// --- fsdp ---
pub mod fsdp;

// --- flight recorder ---
pub mod flight;

#[cfg(feature = "python")]
pub mod python;

pub use error::{Error, Result};
