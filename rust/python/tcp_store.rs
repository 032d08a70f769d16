//! Bindings for the TCP store: the `TCPStore` factory. (`ferrodist-store` is the Rust binary
//! alone; no Python on its path.)
//!
//! `ferrodist.TCPStore` (python/ferrodist/stores/tcp.py) is a `torch.distributed.Store` subclass
//! that delegates to the [`PyNativeStore`] this returns; the handle keeps the connection details
//! torch exposes (`host`, `port`, `libuvBackend`).

use std::sync::Arc;

use pyo3::prelude::*;

use super::blocking::detached;
use super::errors::to_py;
use super::store::{PyNativeStore, Timeout};
use crate::store::Store;
use crate::tcp::{TcpStore, TcpStoreOptions};

/// A connected TCP store (and its server when it is the master).
#[pyclass(name = "TCPStoreHandle", module = "ferrodist._native", frozen)]
pub struct PyTcpStoreHandle {
    inner: Arc<TcpStore>,
}

#[pymethods]
impl PyTcpStoreHandle {
    /// The store, as a native store handle.
    fn store(&self) -> PyNativeStore {
        PyNativeStore::new(self.inner.clone() as Arc<dyn Store>)
    }

    /// The host the client connects to.
    #[getter]
    fn host(&self) -> String {
        self.inner.host().to_owned()
    }

    /// The server port (the one picked when 0 was asked).
    #[getter]
    fn port(&self) -> u16 {
        self.inner.port()
    }

    /// torch's ``use_libuv`` flag, as given.
    #[getter]
    fn libuv_backend(&self) -> bool {
        self.inner.use_libuv()
    }

    /// True when this store hosts the server.
    #[getter]
    fn is_server(&self) -> bool {
        self.inner.server().is_some()
    }

    /// torch's ``repr`` of a TCPStore, in its shape (see ``TcpStore::torch_repr``).
    fn torch_repr(&self) -> String {
        self.inner.torch_repr()
    }

    /// Stops the server this store hosts (no-op for a client), waiting until its port is free.
    fn stop_server(&self, py: Python<'_>) {
        py.detach(|| self.inner.stop_server());
    }

    /// The hosted server's metrics in Prometheus' text format (what ``GET /metrics``
    /// serves); ``None`` on a store that does not host the server.
    fn metrics(&self) -> Option<String> {
        self.inner.metrics()
    }

    /// ``host:port`` where the hosted server serves ``GET /metrics``, when it does.
    #[getter]
    fn metrics_addr(&self) -> Option<String> {
        self.inner.metrics_addr().map(|addr| addr.to_string())
    }

    /// A new connection to the same server (torch's ``clone()``).
    fn clone_handle(&self, py: Python<'_>) -> PyResult<Self> {
        let inner = detached(py, || self.inner.connect_clone())?;
        Ok(PyTcpStoreHandle {
            inner: Arc::new(inner),
        })
    }
}

/// Connects a TCP store (hosting the server when ``is_master``); blocks up to ``timeout``.
///
/// Args:
///     host_name (str): server host; for a master also the bind address (an IP literal binds
///         only that address, a name binds every interface).
///     port (int): server port; 0 with ``is_master`` picks a free one.
///     world_size (int | None): stores expected, the master's included.
///     is_master (bool): host the server in this process.
///     timeout (timedelta | float): default timeout of blocking calls and of connecting.
///     wait_for_workers (bool): count workers (the master waits for ``world_size``).
///     multi_tenant (bool): share a server with other masters of this process on the port.
///     master_listen_fd (int | None): an already bound socket to serve on (duplicated).
///     use_libuv (bool): ``False`` refuses queue operations, as torch's legacy backend.
///     auth_token (str | None): proven to a server that asks; a master's server requires it.
///         ``None`` takes ``FERRODIST_STORE_TOKEN`` or the file ``FERRODIST_STORE_TOKEN_FILE``
///         names, when set.
///     allow_unauthenticated_torch_clients (bool): a master's server with a token still serves
///         stock torch clients.
///     metrics_addr (str | None): ``host:port`` where a master's server serves ``/metrics``.
///         ``None`` takes ``FERRODIST_STORE_METRICS_ADDR`` on a master, when set.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant, master_listen_fd, use_libuv, auth_token=None, allow_unauthenticated_torch_clients=false, metrics_addr=None))]
fn tcp_store(
    py: Python<'_>,
    host_name: String,
    port: u16,
    world_size: Option<u64>,
    is_master: bool,
    timeout: Timeout,
    wait_for_workers: bool,
    multi_tenant: bool,
    master_listen_fd: Option<i32>,
    use_libuv: bool,
    auth_token: Option<String>,
    allow_unauthenticated_torch_clients: bool,
    metrics_addr: Option<String>,
) -> PyResult<PyTcpStoreHandle> {
    let options = TcpStoreOptions {
        host: host_name,
        port,
        world_size,
        is_master,
        timeout: timeout.duration()?,
        wait_for_workers,
        multi_tenant,
        master_listen_fd,
        use_libuv,
        allow_unauthenticated_torch_clients,
        ..TcpStoreOptions::default()
    }
    .with_caller_settings(auth_token.as_deref(), metrics_addr)
    .map_err(to_py)?;
    let inner = detached(py, || TcpStore::new(options))?;
    Ok(PyTcpStoreHandle {
        inner: Arc::new(inner),
    })
}

/// True when a ferrodist server of this process, shared by multi-tenant masters, serves
/// ``port`` (what torch's rendezvous handlers check before binding it themselves).
#[pyfunction]
fn serves_port(port: u16) -> bool {
    crate::tcp::store::serves_port(port)
}

/// Adds the TCP store class and functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTcpStoreHandle>()?;
    m.add_function(wrap_pyfunction!(tcp_store, m)?)?;
    m.add_function(wrap_pyfunction!(serves_port, m)?)?;
    Ok(())
}
