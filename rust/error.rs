//! The one error type of the crate.
//!
//! Every fallible operation in the core returns [`Result`]. The variants carry enough context
//! (operation, keys, peer, elapsed time) for a message a user can act on. The Python bindings map
//! each variant to exactly one Python class in `rust/python/errors.rs`; those classes subclass the
//! torch classes a torch user already catches (`DistStoreError`, `DistNetworkError`, ...).

use std::time::Duration;

/// Crate-wide result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ferrodist's core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A blocking operation passed its deadline. `detail` names what was still missing
    /// (keys, ranks), so the user knows who to look for.
    #[error("{op} timeout after {}ms, {detail}", after.as_millis())]
    Timeout {
        /// The operation that timed out (`wait`, `get`, `barrier`, ...).
        op: String,
        /// The timeout that was in force.
        after: Duration,
        /// What never arrived, e.g. `keys: {a, b}` or `missing ranks: [1, 3]`.
        detail: String,
    },
    /// The peer closed the connection, or it broke mid-request.
    #[error("connection to {peer} closed: {reason}")]
    ConnectionClosed {
        /// `host:port` of the peer.
        peer: String,
        /// What we were doing when it closed.
        reason: String,
    },
    /// Connecting, binding or another network step failed.
    #[error("{0}")]
    Network(String),
    /// A network step passed its deadline: connecting, resolving, or a reply that never came.
    /// Python sees a `DistNetworkError` (what torch raises for its connect timeout) that is also
    /// a `TimeoutError`.
    #[error("{0}")]
    NetworkTimeout(String),
    /// A store server refused this client's credentials (no auth token, or a wrong one).
    /// Never retried; the message names the store and what to do, never the token.
    #[error("{0}")]
    Unauthenticated(String),
    /// An OS-level I/O failure not covered by a more specific variant.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The peer sent bytes that do not follow the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An argument the operation cannot use: one the caller passed (a rank outside the world,
    /// keys and values of different lengths, a sparse tensor torch refuses), or the stored value
    /// the call works on (`add` on a value that is not an integer). Python sees one class that
    /// is a `ValueError` and a `DistStoreError` (so a `RuntimeError`), which covers every
    /// `except` clause torch's own checks are caught by.
    #[error("{0}")]
    InvalidArgument(String),
    /// A non-blocking queue pop found the queue empty.
    #[error("queue is empty")]
    QueueEmpty,
    /// The store does not support the operation (torch raises `NotImplementedError` here too).
    #[error("{0}")]
    NotImplemented(String),
    /// The store or server has been shut down.
    #[error("{0} has been shut down")]
    Shutdown(String),
    /// A file store's log cannot be parsed.
    #[error("file store {path} is corrupt: {reason}")]
    Corrupt {
        /// Path of the store file.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A store-level failure that is none of the above (torch's generic `DistStoreError`).
    #[error("{0}")]
    Store(String),
    /// A plan the core was asked for cannot be made from its input: a check that torch makes
    /// with an assertion (Python sees `AssertionError`, as torch's callers catch it).
    #[error("{0}")]
    Unplannable(Unplannable),
    /// The caller interrupted the operation (Ctrl-C in Python, or a `KeyboardInterrupt` raised
    /// inside a user's Python store); Python sees the original exception again.
    #[error("interrupted")]
    Interrupted,
    // --- collectives ---
    /// A control collective timed out waiting for other ranks. The text follows torch's
    /// (`barrier failed -- missing ranks: 0, 2, wait timeout after 50ms, keys: b/last_members`),
    /// so code matching torch's message keeps working.
    #[error(
        "{op} failed -- missing ranks: {}wait timeout after {}ms, keys: {}",
        missing.iter().map(|r| format!("{r}, ")).collect::<String>(),
        after.as_millis(),
        keys.join(", ")
    )]
    RanksMissing {
        /// `barrier`, `gather` or `all_gather`, as torch names them.
        op: String,
        /// Ranks that never wrote their key, ascending.
        missing: Vec<usize>,
        /// The caller's timeout for the whole collective.
        after: Duration,
        /// The store keys that were still absent.
        keys: Vec<String>,
    },
}

/// Why a plan cannot be made (see [`Error::Unplannable`]): the case and its data, so a caller
/// branches on the variant, never on the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unplannable {
    /// A DDP bucket with no parameters was handed to ZeRO's bucket assignment.
    #[error("Empty bucket (index {index})")]
    EmptyBucket {
        /// The bucket's position in the list given.
        index: usize,
    },
    /// A bucket has more slices than there are ranks to hold them (every rank already holds one
    /// of its slices), so no rank may take the next.
    #[error("All indices are disallowed")]
    NoRankAllowed {
        /// The bucket being cut.
        bucket: usize,
    },
}

impl Error {
    /// Builds a [`Error::Timeout`] for a wait on `keys`.
    pub fn wait_timeout(op: &str, after: Duration, keys: &[String]) -> Self {
        Error::Timeout {
            op: op.to_string(),
            after,
            detail: format!("keys: {{{}}}", keys.join(", ")),
        }
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// A [`Error::Timeout`] of one slice of a longer wait, reported with the whole wait's
    /// `timeout` (what the caller asked for); any other error unchanged.
    pub fn with_whole_timeout(self, timeout: Duration) -> Self {
        match self {
            Error::Timeout { op, detail, .. } => Error::Timeout {
                op,
                after: timeout,
                detail,
            },
            other => other,
        }
    }
}
