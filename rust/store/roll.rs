//! Rolls: a set that every rank of a rendezvous joins, counted as it grows, so that the member
//! that completes it knows it is last.
//!
//! Why a store may have its own: the rendezvous builds a roll from an `append` and an `add`
//! ([`super::super::rendezvous`]), one atomic step each on ferrodist's TCP, hash and file
//! stores. On etcd each of those is a compare-and-swap that every member contends with, so
//! EtcdStore keeps a key per member instead and offers that as its [`Roll`]. The store trait
//! carries only the hook ([`super::Store::roll`]); what a roll is for lives with the
//! rendezvous.

use crate::error::Result;

/// A store's own rolls (see the module doc).
pub trait Roll: Send + Sync {
    /// Adds `member` to the roll named `roll` and returns how many members it counts, this one
    /// included. Of the callers that bring it to `n` members, at least one sees `n`.
    fn enroll(&self, roll: &str, member: usize) -> Result<usize>;

    /// The members of roll `roll` so far, in any order: one request.
    fn enrolled(&self, roll: &str) -> Result<Vec<usize>>;
}
