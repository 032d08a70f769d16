//! The flight recorder: what every collective and point-to-point op of this process did, kept
//! in a fixed-size ring so that a hang can be explained after the fact.
//!
//! A hang's timeout says only that it timed out. With each rank's recent ops at hand (group,
//! per-group sequence number, op, shapes, dtypes, reduce op, call site, state) the job can say
//! which ranks wait in which op and which rank never issued it ([`mod@diagnose`]), which ranks
//! issued different ops under one sequence number (a desync), and which ranks are gone.
//!
//! * [`entry`]: one recorded op and its state.
//! * [`ring`]: the per-process [`Recorder`], a thread-safe fixed-size ring.
//! * [`summary`]: the compact per-rank [`RankSummary`] published to the store while hanging.
//! * [`mod@diagnose`]: summaries of all ranks in, a [`Report`] (behind, desync, gone) out.
//! * [`text`]: the report's wording (`Display`).
//! * [`dump`]: the versioned dump file a rank writes on timeout or on request.
//! * [`live`]: the summaries found in a store's keys, by job ([`LiveView`]), for the store
//!   server's `GET /flight` page and metrics; [`live_text`]: those two forms.

pub mod diagnose;
pub mod dump;
pub mod entry;
pub mod live;
pub mod live_text;
pub mod ring;
pub mod summary;
pub mod text;

pub use diagnose::{diagnose, Behind, BehindRank, Desync, DesyncVariant, Gone, Report};
pub use dump::Dump;
pub use entry::{is_p2p, now_ms, Entry, OpDescription, OpState, TensorMeta};
pub use live::LiveView;
pub use ring::Recorder;
pub use summary::{RankSummary, Signature};
