//! Bindings for the etcd store: the `etcd_store` factory and its handle.
//!
//! `ferrodist.EtcdStore` (python/ferrodist/stores/etcd.py) is a `torch.distributed.Store`
//! subclass that delegates to the [`PyNativeStore`] this returns; the handle keeps what is
//! etcd's own (the prefix, the endpoints, `purge`).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;

use super::blocking::detached;
use super::errors::to_py;
use super::store::{PyNativeStore, Timeout};
use crate::store::etcd::credentials::Redacted;
use crate::store::etcd::{
    check_prefix, Credentials, EtcdOptions, EtcdStore, PasswordSource, TlsFiles,
};
use crate::store::Store;

/// A connected etcd store.
#[pyclass(name = "EtcdStoreHandle", module = "ferrodist._native", frozen)]
pub struct PyEtcdStoreHandle {
    inner: Arc<EtcdStore>,
    plaintext_endpoint: Option<String>,
}

#[pymethods]
impl PyEtcdStoreHandle {
    /// The store, as a native store handle.
    fn store(&self) -> PyNativeStore {
        PyNativeStore::new(self.inner.clone() as Arc<dyn Store>)
    }

    /// The job prefix every key lives under.
    #[getter]
    fn prefix(&self) -> String {
        self.inner.prefix().to_owned()
    }

    /// The endpoints, as given.
    #[getter]
    fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints().to_vec()
    }

    /// The endpoint the credentials go to without TLS (allowed by
    /// `insecure_plaintext_credentials`), or None.
    #[getter]
    fn plaintext_credentials_endpoint(&self) -> Option<String> {
        self.plaintext_endpoint.clone()
    }

    /// Deletes every key of the job; returns how many etcd keys went.
    fn purge(&self, py: Python<'_>) -> PyResult<i64> {
        detached(py, || self.inner.purge())
    }
}

/// Connects to an etcd cluster; blocks up to ``timeout``.
///
/// Args:
///     endpoints (list[str]): ``host:port`` or ``http(s)://host:port`` of the members.
///     prefix (str): the job's prefix; every key lives under ``prefix:`` (see ``check_etcd_prefix``).
///     timeout (timedelta | float): default timeout of blocking calls, deadline of the others.
///     username (str | None), password (str | None): etcd auth; the password may come from
///         ``password_file`` or ``FERRODIST_ETCD_PASSWORD`` instead.
///     password_file (str | None): a file holding the password.
///     insecure_plaintext_credentials (bool): let the credentials go without TLS.
///     ca_file, cert_file, key_file (str | None): PEM files for TLS.
///     tls_domain (str | None): the name the members' certificates are checked against.
#[pyfunction]
#[pyo3(signature = (endpoints, prefix, timeout, username=None, password=None, ca_file=None,
                    cert_file=None, key_file=None, tls_domain=None, password_file=None,
                    insecure_plaintext_credentials=false))]
#[allow(clippy::too_many_arguments)]
fn etcd_store(
    py: Python<'_>,
    endpoints: Vec<String>,
    prefix: String,
    timeout: Timeout,
    username: Option<String>,
    password: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    tls_domain: Option<String>,
    password_file: Option<PathBuf>,
    insecure_plaintext_credentials: bool,
) -> PyResult<PyEtcdStoreHandle> {
    let source = PasswordSource {
        value: password.map(Redacted),
        file: password_file,
    };
    let user = Credentials::resolve(username, source)
        .map_err(to_py)?
        .map(|c| c.with_insecure_plaintext(insecure_plaintext_credentials));
    let any_tls =
        ca_file.is_some() || cert_file.is_some() || key_file.is_some() || tls_domain.is_some();
    let options = EtcdOptions {
        endpoints,
        prefix,
        timeout: timeout.duration()?,
        user,
        tls: any_tls.then_some(TlsFiles {
            ca_file,
            cert_file,
            key_file,
            domain: tls_domain,
        }),
    };
    let store = detached(py, || EtcdStore::connect(&options))?;
    Ok(PyEtcdStoreHandle {
        inner: Arc::new(store),
        plaintext_endpoint: options.plaintext_endpoint().map(str::to_owned),
    })
}

/// Raises ValueError naming the ``prefix`` argument unless ``prefix`` is a valid job prefix:
/// segments of ASCII letters, digits, ``.``, ``_`` and ``-`` joined by single ``/``.
#[pyfunction]
fn check_etcd_prefix(prefix: &str) -> PyResult<()> {
    check_prefix(prefix).map_err(to_py)
}

/// Adds the factory and the handle class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEtcdStoreHandle>()?;
    m.add_function(wrap_pyfunction!(etcd_store, m)?)?;
    m.add_function(wrap_pyfunction!(check_etcd_prefix, m)?)?;
    Ok(())
}
