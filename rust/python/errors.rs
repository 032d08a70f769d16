//! The one mapping from the core [`Error`] to Python exceptions.
//!
//! The classes live in `python/ferrodist/errors.py` because each inherits both a ferrodist base
//! and the torch or built-in class a torch user already catches (pyo3's `create_exception!`
//! takes a single base).
//!
//! One Python exception must come back unchanged rather than be rebuilt from the core error:
//! an interruption (Ctrl-C seen between wait slices, a `KeyboardInterrupt` or `SystemExit`
//! raised inside a user's Python store). The core only carries [`Error::Interrupted`] (it never
//! touches Python), so the original exception waits in [`park`] on this thread until
//! [`to_py`] hands it back.

use std::cell::RefCell;

use pyo3::exceptions::{PyAssertionError, PyKeyboardInterrupt, PyNotImplementedError, PyOSError};
use pyo3::prelude::*;

use crate::error::Error;

pyo3::import_exception!(ferrodist.errors, DistStoreError);
pyo3::import_exception!(ferrodist.errors, DistNetworkError);
pyo3::import_exception!(ferrodist.errors, NetworkTimeoutError);
pyo3::import_exception!(ferrodist.errors, StoreTimeoutError);
pyo3::import_exception!(ferrodist.errors, ConnectionClosedError);
pyo3::import_exception!(ferrodist.errors, QueueEmptyError);
pyo3::import_exception!(ferrodist.errors, InvalidArgumentError);
pyo3::import_exception!(ferrodist.errors, AuthenticationError);

thread_local! {
    /// The Python exception behind the [`Error::Interrupted`] now unwinding on this thread.
    static PARKED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// Keeps `err` (an interruption) to be raised again by [`to_py`] on this thread; the caller
/// returns [`Error::Interrupted`] through the core.
pub fn park(err: PyErr) {
    PARKED.with(|parked| *parked.borrow_mut() = Some(err));
}

/// Converts a core error into the Python exception a torch user expects.
pub fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    match err {
        Error::Timeout { .. } | Error::RanksMissing { .. } => StoreTimeoutError::new_err(message),
        Error::ConnectionClosed { .. } | Error::Shutdown(_) => {
            ConnectionClosedError::new_err(message)
        }
        Error::Network(_) => DistNetworkError::new_err(message),
        Error::NetworkTimeout(_) => NetworkTimeoutError::new_err(message),
        Error::Unauthenticated(_) => AuthenticationError::new_err(message),
        Error::Io(io) => PyOSError::new_err((io.raw_os_error().unwrap_or(0), io.to_string())),
        Error::InvalidArgument(_) => InvalidArgumentError::new_err(message),
        Error::QueueEmpty => QueueEmptyError::new_err(message),
        Error::NotImplemented(_) => PyNotImplementedError::new_err(message),
        Error::Unplannable(_) => PyAssertionError::new_err(message),
        Error::Protocol(_) | Error::Corrupt { .. } | Error::Store(_) => {
            DistStoreError::new_err(message)
        }
        Error::Interrupted => PARKED
            .with(|parked| parked.borrow_mut().take())
            .unwrap_or_else(|| PyKeyboardInterrupt::new_err(message)),
    }
}
