//! What a store can do beyond the calls every store has, as one value.
//!
//! Why one value rather than a method per flag: each flag is a decision the core makes about
//! how to call a store (slice a wait so Ctrl-C is seen, bound a collective's writes, skip a GIL
//! release), and a wrapper (`PrefixStore`) forwards them all at once. A store states what it
//! is in one place; [`super::blocking`] and the collectives read it.

/// What a store can do; see each field. [`Capabilities::BASIC`] is a store ferrodist built
/// over a socket or a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `append`, `multi_get` and `multi_set` are native rather than torch's fallbacks (torch's
    /// `has_extended_api`).
    pub extended_api: bool,
    /// A blocking call may be cut into short slices, checking for an interruption (Ctrl-C)
    /// between them, at no cost worth naming. False for a foreign Python store: each slice is a
    /// call of its own there (torch's TCPStore logs a warning per timed-out slice, its
    /// FileStore rounds each slice up to a whole second), so [`super::blocking`] makes one
    /// call with all the time left.
    pub interruptible_waits: bool,
    /// The store lives in this process's memory (HashStore, a PrefixStore over one): a call
    /// that waits for no key holds an in-process lock for a bounded time and never waits on
    /// another process or the network, so the bindings make it without releasing the GIL (a
    /// release and re-take costs about 80 ns, a quarter of such a call).
    pub in_memory: bool,
    /// Every write (set, multi_set, ...) fails rather than block past the store's timeout.
    /// False for a foreign Python store, whose writes may block as long as they like (torch's
    /// TCPStore client has no deadline on a write); the collectives then bound them
    /// themselves.
    pub bounded_writes: bool,
}

impl Capabilities {
    /// A store ferrodist built over a socket or a file: interruptible waits, bounded writes.
    pub const BASIC: Capabilities = Capabilities {
        extended_api: false,
        interruptible_waits: true,
        in_memory: false,
        bounded_writes: true,
    };
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities::BASIC
    }
}
