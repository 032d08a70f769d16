//! [`TcpStore`]: torch's `TCPStore` as a blocking [`Store`], for the Python bindings and for
//! synchronous Rust callers.
//!
//! It adds torch's key conventions on top of [`Client`] (user keys travel as `/key`, the worker
//! counter is the bare `init/`) so it shares one key space with stock torch clients, and it runs
//! every call on the caller's thread with a deadline: nothing waits forever, a server that stops
//! answering fails the call with a network error within the store timeout (torch's client would
//! hang in `recv`). Calls from several threads run side by side, each on a connection of its
//! own from the store's [`ConnPool`].
//!
//! A master hosts the server in its own process, on the runtime (no thread of its own), and
//! counts workers by waiting on the server's state directly rather than polling it. With
//! `multi_tenant`, masters in one process asking for the same port share one server, and
//! must ask for the same server configuration (`tenants.rs`).
//!
//! After a connection breaks (server restarted, call abandoned at its deadline), the next call
//! makes one reconnect attempt before failing, so a store survives a restarted server; where
//! the handshake said the server's state outlives it, it retries until its deadline, and a
//! wait that was blocked when the connection broke is sent again (`waits.rs`).
//!
//! Its calls block the calling thread: do not make them from inside the runtime (an async task).
//!
//! # Files
//!
//! * `mod.rs`: construction, hosting, the connection per call; `ops.rs`: each [`Store`] method
//!   as torch's wire sequence; `barrier.rs`: `barrier` on servers with and without BARRIER
//!   (torch < 2.13 closes the connection on it); `tenants.rs`: the servers this process hosts
//!   and the configuration each runs with; `waits.rs`: the calls that wait for keys, and how
//!   they outlive a durable server's restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::store::{Deadline, Store};
use crate::tcp::auth::AuthToken;
use crate::tcp::client::conn_pool::ConnPool;
use crate::tcp::client::Client;
use crate::tcp::codec::{Limits, Reply, Request};
use crate::tcp::server::{self, Server, ServerConfig};

use self::tenants::{HostedConfig, Tenants};

/// Extra time a wait's call gets beyond the wait itself, for cancelling an earlier wait.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// The worker counter key, unprefixed as torch's client sends it.
pub const WORKER_COUNTER_KEY: &str = "init/";

/// What `TcpStore::new` needs; the fields mirror torch's `TCPStore` arguments.
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
    /// Server host to connect to (and, for a master, the address to bind; see [`ServerConfig`]).
    pub host: String,
    /// Server port; 0 with `is_master` picks a free one.
    pub port: u16,
    /// Number of stores expected, the master's included; `None` skips worker counting.
    pub world_size: Option<u64>,
    /// Host the server in this process.
    pub is_master: bool,
    /// Default timeout of blocking calls, and the connect deadline.
    pub timeout: Duration,
    /// Count workers: every store adds 1 to `init/`; the master waits for `world_size`.
    pub wait_for_workers: bool,
    /// Share one server among masters of this process on the same (non-zero) port; a master
    /// that asks for another server configuration (token, limits, torch clients, metrics
    /// address) than the running one gets [`Error::InvalidArgument`] naming what differs.
    pub multi_tenant: bool,
    /// Serve on this already bound socket instead of binding (duplicated, not taken).
    pub master_listen_fd: Option<i32>,
    /// torch's flag; `false` refuses queue operations, as torch's legacy backend does.
    pub use_libuv: bool,
    /// Limits the hosted server enforces.
    pub limits: Limits,
    /// Proven to a server that asks for it; a master's server requires it of every client.
    pub auth_token: Option<AuthToken>,
    /// A master's server with a token still serves clients that cannot present one.
    pub allow_unauthenticated_torch_clients: bool,
    /// A master's server serves `GET /metrics` and `GET /healthz` on this `host:port`.
    pub metrics_addr: Option<String>,
}

impl Default for TcpStoreOptions {
    fn default() -> Self {
        TcpStoreOptions {
            host: "127.0.0.1".into(),
            port: 0,
            world_size: None,
            is_master: false,
            timeout: crate::store::DEFAULT_TIMEOUT,
            wait_for_workers: true,
            multi_tenant: false,
            master_listen_fd: None,
            use_libuv: true,
            limits: Limits::default(),
            auth_token: None,
            allow_unauthenticated_torch_clients: false,
            metrics_addr: None,
        }
    }
}

/// Environment variable: where a master's server serves `GET /metrics` when its caller names
/// no address (`TCPStore(metrics_addr=None)`).
pub const METRICS_ADDR_ENV: &str = "FERRODIST_STORE_METRICS_ADDR";

impl TcpStoreOptions {
    /// Fills in what the caller left to the environment, by one rule for every caller (the
    /// bindings pass their arguments through): the token is `auth_token`, else
    /// [`AuthToken::from_env`]; a master's metrics address is `metrics_addr`, else
    /// [`METRICS_ADDR_ENV`] when set. A client serves no metrics, so the variable is not its.
    pub fn with_caller_settings(
        mut self,
        auth_token: Option<&str>,
        metrics_addr: Option<String>,
    ) -> Result<Self> {
        self.auth_token = AuthToken::given_or_env(auth_token, "auth_token")?;
        self.metrics_addr = match metrics_addr {
            Some(addr) => Some(addr),
            None if self.is_master => metrics_addr_from_env()?,
            None => None,
        };
        Ok(self)
    }
}

fn metrics_addr_from_env() -> Result<Option<String>> {
    match std::env::var(METRICS_ADDR_ENV) {
        Ok(addr) if !addr.trim().is_empty() => Ok(Some(addr)),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::InvalidArgument(format!(
            "{METRICS_ADDR_ENV} is not UTF-8 text"
        ))),
    }
}

/// True when a server of this process that multi-tenant masters share listens on `port`.
pub fn serves_port(port: u16) -> bool {
    Tenants::lock().live(port).is_some()
}

/// A blocking, torch-compatible TCP store client (and, for a master, its server).
pub struct TcpStore {
    host: String,
    port: u16,
    use_libuv: bool,
    timeout: Mutex<Duration>,
    conns: ConnPool,
    server: Option<Arc<Server>>,
    /// Whether the server handles BARRIER (torch < 2.13 does not); see `store_barrier.rs`.
    barrier_support: barrier::BarrierSupport,
}

fn wire(key: &str) -> Bytes {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    Bytes::from(k)
}

fn wire_all(keys: &[String]) -> Vec<Bytes> {
    keys.iter().map(|k| wire(k)).collect()
}

impl TcpStore {
    /// Connects (hosting the server first when `is_master`) and counts workers, blocking until
    /// done or `options.timeout` passes.
    pub fn new(options: TcpStoreOptions) -> Result<TcpStore> {
        if options.world_size == Some(0) {
            return Err(Error::InvalidArgument(
                "TCPStore world size cannot be 0".into(),
            ));
        }
        let (server, started) = if options.is_master {
            match host_server(&options) {
                Ok(hosted) => hosted,
                // A configuration that differs from this process's own server is the
                // caller's mistake, not a port the agent holds.
                Err(err)
                    if !matches!(err, Error::InvalidArgument(_)) && agent_serves(options.port) =>
                {
                    // As torch: under torchelastic the agent already serves this port.
                    tracing::warn!(%err, port = options.port,
                        "TORCHELASTIC_USE_AGENT_STORE is set and the agent serves MASTER_PORT: \
                         carrying on as a client of its store");
                    (None, false)
                }
                Err(err) => return Err(err),
            }
        } else {
            (None, false)
        };
        let port = server
            .as_ref()
            .map_or(options.port, |s| s.local_addr().port());
        let token = options.auth_token.as_ref();
        let client = Client::connect_with_token(&options.host, port, options.timeout, token)?;
        let store = TcpStore {
            host: options.host.clone(),
            port,
            use_libuv: options.use_libuv,
            timeout: Mutex::new(options.timeout),
            conns: ConnPool::new(&options.host, port, token.cloned(), Some(client)),
            server,
            barrier_support: Default::default(),
        };
        if let (Some(world_size), true) = (options.world_size, options.wait_for_workers) {
            store.raw_add(WORKER_COUNTER_KEY, 1)?;
            if started {
                store.wait_for_workers(world_size as i64, options.timeout)?;
            }
        }
        Ok(store)
    }

    /// The host this store connects to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The server's port (the one picked, when 0 was asked).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// torch's `libuvBackend` flag as given.
    pub fn use_libuv(&self) -> bool {
        self.use_libuv
    }

    /// The hosted server's metrics in Prometheus' text format; `None` on a client.
    pub fn metrics(&self) -> Option<String> {
        self.server.as_ref().map(|server| server.render_metrics())
    }

    /// Where the hosted server serves `GET /metrics`, when it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.server
            .as_ref()
            .and_then(|server| server.metrics_addr())
    }

    /// Stops the server this store hosts, if any (see [`Server::stop`]); its clients, this
    /// store's included, fail from then on.
    pub fn stop_server(&self) {
        if let Some(server) = &self.server {
            server.stop();
        }
    }

    /// What torch 2.13's `repr` of a TCPStore says, in its shape:
    /// `TCPStore(client=TCPClient(SocketImpl(...)), server=TCPServer(port=N))`, with
    /// `server=<nullptr>` on a store that hosts none and `TCPClient(<busy>)` while no
    /// connection is idle (every one is in a call).
    pub fn torch_repr(&self) -> String {
        let client = self
            .conns
            .describe_idle()
            .unwrap_or_else(|| "<busy>".to_owned());
        let server = match &self.server {
            Some(_) => format!("TCPServer(port={})", self.port),
            None => "<nullptr>".to_owned(),
        };
        format!("TCPStore(client=TCPClient({client}), server={server})")
    }

    /// The server this store hosts, if it is a master.
    pub fn server(&self) -> Option<&Arc<Server>> {
        self.server.as_ref()
    }

    fn wait_for_workers(&self, world_size: i64, timeout: Duration) -> Result<()> {
        let server = self
            .server
            .as_ref()
            .expect("only the hosting master counts");
        let db = server.db().clone();
        let key = Bytes::from_static(WORKER_COUNTER_KEY.as_bytes());
        let deadline = Deadline::after(timeout);
        crate::runtime::runtime().block_on(async {
            loop {
                let mut waiter = match db.counter_at_least(&key, world_size) {
                    Ok(_) => return Ok(()),
                    Err(waiter) => waiter,
                };
                let released = match deadline.remaining() {
                    None => {
                        waiter.released().await;
                        true
                    }
                    Some(left) => tokio::time::timeout(left, waiter.released()).await.is_ok(),
                };
                if !released {
                    let joined = db.get(&key);
                    return Err(Error::Store(format!(
                        "Timed out after {} seconds waiting for clients. {}/{world_size} clients joined.",
                        timeout.as_secs(),
                        String::from_utf8_lossy(&joined).parse::<i64>().unwrap_or(0)
                    )));
                }
            }
        })
    }

    /// Runs `op` with `deadline` (`None`: the store timeout, zero: none) on an idle connection,
    /// or a new one when every connection is busy in another thread or the last one broke.
    fn run<T>(
        &self,
        deadline: Option<Duration>,
        op: impl FnOnce(&mut Client, Deadline) -> Result<T>,
    ) -> Result<T> {
        let deadline = Deadline::after(deadline.unwrap_or_else(|| self.timeout()));
        let mut client = self.conns.checkout(deadline)?;
        let outcome = op(&mut client, deadline);
        self.conns.checkin(client);
        outcome
    }

    fn raw_add(&self, key: &str, amount: i64) -> Result<i64> {
        let key = Bytes::copy_from_slice(key.as_bytes());
        self.run(None, |c, d| {
            c.call_int(d, &Request::Add { key, delta: amount })
        })
    }
}

/// True when torchelastic's agent hosts the store on `port`: `TORCHELASTIC_USE_AGENT_STORE` is
/// set and `MASTER_PORT` is `port`. A master that cannot bind then joins the agent's store.
fn agent_serves(port: u16) -> bool {
    let flagged = std::env::var_os("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| !v.is_empty());
    let master_port = std::env::var("MASTER_PORT").ok();
    flagged && port != 0 && master_port.and_then(|p| p.trim().parse::<u16>().ok()) == Some(port)
}

fn host_server(options: &TcpStoreOptions) -> Result<(Option<Arc<Server>>, bool)> {
    let mut tenants = Tenants::lock();
    let asked = HostedConfig::of(options);
    if options.multi_tenant && options.port != 0 {
        if let Some(server) = tenants.join(options.port, &asked)? {
            return Ok((Some(server), false));
        }
    }
    let config = ServerConfig {
        host: options.host.clone(),
        port: options.port,
        limits: options.limits,
        expected_clients: options.world_size,
        auth_token: options.auth_token.clone(),
        allow_unauthenticated_torch_clients: options.allow_unauthenticated_torch_clients,
        metrics_addr: options.metrics_addr.clone(),
        ..ServerConfig::default()
    };
    let listener = match options.master_listen_fd {
        Some(fd) => server::adopt(fd, options.port, config.backlog)?,
        None => server::bind(&config)?,
    };
    let server = Arc::new(Server::serve(listener, &config)?);
    tenants.register(&server, asked);
    Ok((Some(server), true))
}

fn expect_value(reply: Option<Reply>) -> Result<Vec<u8>> {
    match reply {
        Some(Reply::Value(v)) => Ok(v.to_vec()),
        other => Err(Error::Protocol(format!("expected a value, got {other:?}"))),
    }
}

mod ops;

mod barrier;

mod tenants;

mod waits;
