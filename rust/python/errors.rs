//! The one mapping from the core [`Error`] to Python exceptions.
//!
//! The classes live in `python/ferrodist/errors.py` because each inherits both a ferrodist base
//! and the torch or built-in class a torch user already catches (pyo3's `create_exception!`
//! takes a single base).

use pyo3::exceptions::{PyNotImplementedError, PyOSError};
use pyo3::prelude::*;

use crate::error::Error;

pyo3::import_exception!(ferrodist.errors, DistStoreError);
pyo3::import_exception!(ferrodist.errors, DistNetworkError);
pyo3::import_exception!(ferrodist.errors, StoreTimeoutError);
pyo3::import_exception!(ferrodist.errors, ConnectionClosedError);
pyo3::import_exception!(ferrodist.errors, QueueEmptyError);
pyo3::import_exception!(ferrodist.errors, InvalidArgumentError);
// --- collectives ---
pyo3::import_exception!(ferrodist.errors, InvalidInputError);

/// Converts a core error into the Python exception a torch user expects.
pub fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    match err {
        Error::Timeout { .. } => StoreTimeoutError::new_err(message),
        Error::ConnectionClosed { .. } | Error::Shutdown(_) => {
            ConnectionClosedError::new_err(message)
        }
        Error::Network(_) => DistNetworkError::new_err(message),
        Error::Io(io) => PyOSError::new_err((io.raw_os_error().unwrap_or(0), io.to_string())),
        Error::InvalidArgument(_) | Error::InvalidValue(_) => {
            InvalidArgumentError::new_err(message)
        }
        Error::QueueEmpty => QueueEmptyError::new_err(message),
        Error::NotImplemented(_) => PyNotImplementedError::new_err(message),
        Error::Protocol(_) | Error::Corrupt { .. } | Error::Store(_) | Error::Interrupted => {
            DistStoreError::new_err(message)
        }
        Error::InvalidInput(_) => InvalidInputError::new_err(message),
        Error::RanksMissing { .. } => StoreTimeoutError::new_err(message),
    }
}
