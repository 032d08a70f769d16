//! The TCPStore server: bind, accept, one [`Handler`] task per connection, graceful shutdown.
//!
//! What it does better than torch's servers, at no cost to stock clients:
//!
//! * **The bind address is honoured.** An IP literal binds that address only (`127.0.0.1` keeps
//!   the store off the network); an empty host, `0.0.0.0`, `::` or a host *name* binds every
//!   interface, as torch always does (a name may resolve to loopback locally and to a routable
//!   address on the workers, so binding what it resolves to here would lock them out).
//! * **No reverse DNS.** Peers are logged by IP address; nothing ever resolves them.
//! * **A listen backlog sized for storms**: [`DEFAULT_BACKLOG`] (the kernel caps it at
//!   `net.core.somaxconn`, which the server warns about when it is below the expected world).
//! * `TCP_NODELAY` on every accepted socket; bounded memory per connection (see [`Limits`]).
//! * **Access control** (off by default): with a token, only clients that prove they hold it
//!   are served ([`crate::tcp::auth`]); a cap on open connections refuses the ones beyond it at
//!   once, leaving those admitted alone.
//! * **Metrics**: counters kept as atomics ([`metrics`]), rendered for Prometheus on
//!   `GET /metrics` with `GET /healthz` beside it ([`metrics_http`]) when asked for, and
//!   readable in process through [`Server::render_metrics`]. The same endpoint shows the
//!   flight recorder's summaries of the jobs it serves (`GET /flight`, [`crate::flight::live`]).
//!
//! Everything runs on the process's one tokio runtime ([`crate::runtime`]); [`Server::start`]
//! returns at once with a handle whose drop (or [`Server::shutdown`]) stops the server and waits
//! for its connections to finish.
//!
//! # Files
//!
//! * `mod.rs`: bind, accept, the [`Server`] handle; `handler.rs`: one connection;
//!   `dispatch.rs`: the one way from a data request to the storage engine
//!   ([`crate::store::engine`]: the in-memory [`Db`], or etcd) and back to torch's reply;
//!   `outbox.rs`: its replies not yet written (large MULTI_GET replies streamed);
//!   `shutdown.rs`: stop signal and drain; `handshake_deadline.rs`: closes connections that
//!   never validate; `log_budget.rs`: at most so many warnings a second per call site;
//!   `handler/admission.rs`: a connection's handshake (VALIDATE, the token's proof);
//!   `metrics.rs`: the counters and their Prometheus text; `metrics_http.rs`: their endpoint.
//!
//! The key-value state the server serves is [`crate::store::db`], shared with HashStore, or,
//! with [`Server::serve_engine`] and an [`EtcdEngine`](crate::store::EtcdEngine), an etcd
//! cluster.

pub mod dispatch;
pub mod handler;
pub mod handshake_deadline;
pub mod log_budget;
pub mod metrics;
pub mod metrics_http;
pub mod outbox;
pub mod shutdown;
pub mod work_slice;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

use self::handler::Handler;
use self::metrics::{Metrics, Refusal};
use self::shutdown::{Drain, Shutdown, Trigger};
use crate::error::{Error, Result};
use crate::store::db::Db;
use crate::store::engine::Engine;
use crate::tcp::auth::AuthToken;
use crate::tcp::codec::Limits;

/// Listen backlog asked for; the kernel lowers it to `net.core.somaxconn`.
pub const DEFAULT_BACKLOG: i32 = 65_535;

/// How a server listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind: an IP literal binds only it; empty, `0.0.0.0`, `::` or a host name
    /// binds every interface.
    pub host: String,
    /// Port; 0 picks a free one (see [`Server::local_addr`]).
    pub port: u16,
    /// Listen backlog.
    pub backlog: i32,
    /// Per-request limits; a request over them closes its connection only.
    pub limits: Limits,
    /// Ranks expected, used only to warn when the kernel's backlog cap is below it.
    pub expected_clients: Option<u64>,
    /// A connection that has not sent VALIDATE (and, with a token, proven it holds it) this
    /// long after it was accepted is closed.
    pub validate_within: Duration,
    /// Serve only clients that prove they hold this token (see [`crate::tcp::auth`]).
    pub auth_token: Option<AuthToken>,
    /// With a token: still serve clients that cannot present one (stock torch clients), from
    /// the networks of [`ServerConfig::torch_clients_from`] only.
    pub allow_unauthenticated_torch_clients: bool,
    /// Where clients admitted without a token may connect from; empty: loopback only
    /// ([`LOOPBACK_NETWORKS`]), so a torchrun agent on the store's own host is served and
    /// nobody else gets around the token.
    pub torch_clients_from: Vec<IpNet>,
    /// Connections beyond this many open ones are closed at once.
    pub max_connections: Option<u64>,
    /// Serve `GET /metrics` and `GET /healthz` on this `host:port` (port 0 picks one).
    pub metrics_addr: Option<String>,
}

/// Default of [`ServerConfig::validate_within`]: torch's clients validate at once, so a
/// connection silent this long is not one of them (a generous bound for loaded machines).
pub const DEFAULT_VALIDATE_WITHIN: Duration = Duration::from_secs(30);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: String::new(),
            port: 0,
            backlog: DEFAULT_BACKLOG,
            limits: Limits::default(),
            expected_clients: None,
            validate_within: DEFAULT_VALIDATE_WITHIN,
            auth_token: None,
            allow_unauthenticated_torch_clients: false,
            torch_clients_from: Vec::new(),
            max_connections: None,
            metrics_addr: None,
        }
    }
}

/// What every connection of one server reads: its limits and access rules, and the metrics
/// they all count into. One pointer per connection.
pub struct Shared {
    /// Per-request limits.
    pub limits: Limits,
    /// See [`ServerConfig::validate_within`].
    pub validate_within: Duration,
    /// See [`ServerConfig::auth_token`].
    pub auth_token: Option<AuthToken>,
    /// With a token: the networks stock torch clients are served from without one (see
    /// [`ServerConfig::allow_unauthenticated_torch_clients`]); `None` refuses them all.
    pub torch_clients_from: Option<Vec<IpNet>>,
    /// See [`ServerConfig::max_connections`].
    pub max_connections: Option<u64>,
    /// The server's counters.
    pub metrics: Metrics,
}

/// The networks stock clients are admitted from without a token when none are named.
pub const LOOPBACK_NETWORKS: [&str; 2] = ["127.0.0.0/8", "::1/128"];

impl Shared {
    /// Whether a stock torch client at `peer` is served without a token.
    pub fn admits_torch_client(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.torch_clients_from
            .as_ref()
            .is_some_and(|networks| networks.iter().any(|net| net.contains(&peer)))
    }

    /// The shared part of `config`, with fresh metrics.
    pub fn new(config: &ServerConfig) -> Shared {
        Shared {
            limits: config.limits,
            validate_within: config.validate_within,
            auth_token: config.auth_token.clone(),
            torch_clients_from: config.allow_unauthenticated_torch_clients.then(|| {
                if config.torch_clients_from.is_empty() {
                    LOOPBACK_NETWORKS
                        .iter()
                        .map(|n| n.parse().expect("valid"))
                        .collect()
                } else {
                    config.torch_clients_from.clone()
                }
            }),
            max_connections: config.max_connections,
            metrics: Metrics::default(),
        }
    }
}

impl Default for Shared {
    fn default() -> Shared {
        Shared::new(&ServerConfig::default())
    }
}

/// A running server. Dropping it shuts it down.
pub struct Server {
    local_addr: SocketAddr,
    db: Db,
    shared: Arc<Shared>,
    metrics_addr: Option<SocketAddr>,
    trigger: Trigger,
    drain: std::sync::Mutex<Option<Drain>>,
    /// The process that started the server: a forked child has none of its tasks to wait for.
    owner_pid: u32,
    /// A second descriptor of the listening socket, so [`Server::stop`] can end the listening
    /// itself even when the accept task cannot run promptly (busy or blocked runtime workers).
    listening: std::sync::Mutex<Option<std::net::TcpListener>>,
}

/// The addresses to try binding for `host`, most preferred first.
fn bind_addresses(host: &str, port: u16) -> Vec<SocketAddr> {
    let trimmed = host.trim_start_matches('[').trim_end_matches(']');
    if trimmed
        .trim_end_matches('.')
        .eq_ignore_ascii_case("localhost")
    {
        // "localhost" means this machine only (it used to bind every interface, as a name
        // does); clients that resolve it to ::1 first move on to 127.0.0.1.
        return vec![SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)];
    }
    match trimmed.parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => vec![SocketAddr::new(ip, port)],
        Ok(IpAddr::V4(_)) => vec![SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)],
        _ => vec![
            SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
            SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port),
        ],
    }
}

/// Makes a listening socket on `addr` (dual-stack for `::`).
fn listen_on(addr: SocketAddr, backlog: i32) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket)
}

/// Binds a listener for `config` (blocking; cheap).
pub fn bind(config: &ServerConfig) -> Result<std::net::TcpListener> {
    let mut last = None;
    for addr in bind_addresses(&config.host, config.port) {
        match listen_on(addr, config.backlog) {
            Ok(socket) => return Ok(socket.into()),
            Err(err) => last = Some((addr, err)),
        }
    }
    let (addr, err) = last.expect("at least one address is tried");
    // torch's opening words, which callers match on; then what was tried and why it failed.
    Err(Error::Network(format!(
        "The server socket has failed to listen on any local network address. \
         host: {:?}, port: {}, address: {addr}, error: {err}",
        config.host, config.port
    )))
}

/// Takes over a socket the caller already bound (torch's `master_listen_fd`) and listens on it.
/// The descriptor is duplicated, so the caller keeps ownership of its own.
#[cfg(unix)]
pub fn adopt(fd: std::os::fd::RawFd, port: u16, backlog: i32) -> Result<std::net::TcpListener> {
    use std::os::fd::BorrowedFd;
    // SAFETY: the caller promises `fd` is an open socket for the duration of this call; we only
    // borrow it to duplicate it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let socket = Socket::from(borrowed.try_clone_to_owned()?);
    let bound = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| Error::InvalidArgument("master_listen_fd is not a TCP socket".into()))?;
    if port != 0 && bound.port() != port {
        return Err(Error::InvalidArgument(format!(
            "master_listen_fd is bound to port {} but port {port} was requested",
            bound.port()
        )));
    }
    socket.listen(backlog)?;
    Ok(socket.into())
}

fn warn_if_backlog_too_small(expected: Option<u64>) {
    let Some(expected) = expected else { return };
    let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(cap) = cap.filter(|&cap| cap < expected) {
        tracing::warn!(
            somaxconn = cap,
            expected,
            "net.core.somaxconn is below the number of clients; connects may be retried"
        );
    }
}

impl Server {
    /// Binds per `config` and starts serving on the shared runtime.
    pub fn start(config: &ServerConfig) -> Result<Server> {
        let listener = bind(config)?;
        Server::serve(listener, config)
    }

    /// Starts serving on an already listening socket (from [`bind`] or [`adopt`]).
    pub fn serve(listener: std::net::TcpListener, config: &ServerConfig) -> Result<Server> {
        let db = Db::new();
        Server::serve_engine(listener, config, db.clone(), db)
    }

    /// Binds per `config` and serves requests from `engine` (an etcd cluster, say).
    pub fn start_with_engine<E: Engine>(config: &ServerConfig, engine: E) -> Result<Server> {
        let listener = bind(config)?;
        Server::serve_engine(listener, config, engine, Db::new())
    }

    /// Starts serving requests from `engine` on an already listening socket. `db` is what
    /// [`Server::db`] and the metrics' key gauges read (the engine itself when it is the
    /// in-memory one; an empty one that stays empty for an engine elsewhere).
    pub fn serve_engine<E: Engine>(
        listener: std::net::TcpListener,
        config: &ServerConfig,
        engine: E,
        db: Db,
    ) -> Result<Server> {
        warn_if_backlog_too_small(config.expected_clients);
        listener.set_nonblocking(true)?;
        socket2::SockRef::from(&listener).set_tcp_nodelay(true)?;
        let local_addr = listener.local_addr()?;
        let listening = listener.try_clone()?;
        let shared = Arc::new(Shared::new(config));
        let (trigger, shutdown, drain) = shutdown::channel();
        let runtime = crate::runtime::runtime();
        let _entered = runtime.enter();
        let scrapes = match &config.metrics_addr {
            Some(addr) => Some(bind_metrics(addr)?),
            None => None,
        };
        let metrics_addr = scrapes.as_ref().map(TcpListener::local_addr).transpose()?;
        let listener = TcpListener::from_std(listener)?;
        if let Some(scrapes) = scrapes {
            // A durable engine keeps the state elsewhere; `db` is then an empty stand-in.
            let flight = !E::DURABLE;
            let served = metrics_http::serve(
                scrapes,
                db.clone(),
                shared.clone(),
                flight,
                shutdown.clone(),
            );
            runtime.spawn(served);
        }
        runtime.spawn(accept_loop(listener, engine, shared.clone(), shutdown));
        tracing::info!(%local_addr, "store server listening");
        if let Some(addr) = metrics_addr {
            tracing::info!(%addr, "metrics on http://{addr}/metrics");
        }
        if shared.auth_token.is_some() {
            match &shared.torch_clients_from {
                None => tracing::info!(
                    "clients must prove they hold the auth token; stock torch clients (which \
                     cannot) are refused"
                ),
                Some(networks) => tracing::warn!(
                    networks = ?networks.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "clients must prove they hold the auth token, except stock torch clients \
                     from these networks, which are served without it and can read and write \
                     every key"
                ),
            }
        }
        Ok(Server {
            local_addr,
            db,
            shared,
            metrics_addr,
            trigger,
            drain: std::sync::Mutex::new(Some(drain)),
            owner_pid: std::process::id(),
            listening: std::sync::Mutex::new(Some(listening)),
        })
    }

    /// The address the server listens on (with the port picked when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// True once [`Server::stop`] has closed the listener.
    pub fn is_stopped(&self) -> bool {
        self.listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// The server's state, for code running in the same process.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The server's counters.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Every metric in Prometheus' text format, as `GET /metrics` serves it.
    pub fn render_metrics(&self) -> String {
        self.shared.metrics.render_prometheus(&self.db)
    }

    /// Where `GET /metrics` is served, when it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops accepting, closes every connection and waits up to `grace` for their tasks.
    pub async fn shutdown(mut self, grace: Duration) {
        self.trigger.fire();
        let drain = self
            .drain
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(drain) = drain {
            let _ = tokio::time::timeout(grace, drain.wait()).await;
        }
    }
}

/// How long dropping a server outside the runtime waits for its listener and connections.
const DROP_GRACE: Duration = Duration::from_secs(2);

impl Server {
    /// Stops the server from synchronous code: stops accepting, closes every connection and,
    /// outside the runtime, waits (at most `DROP_GRACE`) until the listener is closed, so the
    /// port can be bound again as soon as this returns (a second `init_process_group` on the
    /// same tcp:// address must not race the old server). On a runtime thread, or in a forked
    /// child that has none of the server's tasks, it only signals. Idempotent.
    pub fn stop(&self) {
        self.trigger.fire();
        let listening = self
            .listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(listening) = listening {
            // Shutting down a listening socket makes Linux stop listening on its port at once
            // (pending and future connects are refused); the descriptor is ours, so this cannot
            // touch a socket that has reused a closed descriptor number.
            let _ = socket2::SockRef::from(&listening).shutdown(std::net::Shutdown::Read);
        }
        let owned_here = self.owner_pid == std::process::id();
        if owned_here && tokio::runtime::Handle::try_current().is_err() {
            let drain = self.drain.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(drain) = drain {
                crate::runtime::runtime().block_on(async {
                    let _ = tokio::time::timeout(DROP_GRACE, drain.wait()).await;
                });
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether accepted sockets inherit `TCP_NODELAY` from the listener. Linux copies it, which
/// saves a `setsockopt` per connection in a rendezvous storm; elsewhere each socket sets it.
const NODELAY_INHERITED: bool = cfg!(target_os = "linux");

/// `accept` failures (out of descriptors, say) are logged at most once a second.
static ACCEPT_LOG: log_budget::LogBudget = log_budget::LogBudget::new(1);
/// Connections refused for the connection cap are logged at most once a second.
static OVER_CAP_LOG: log_budget::LogBudget = log_budget::LogBudget::new(1);

/// Binds the metrics endpoint's listener (on the runtime).
fn bind_metrics(addr: &str) -> Result<TcpListener> {
    let bad = |e: std::io::Error| {
        Error::Network(format!(
            "cannot serve metrics on {addr}: {e} (want HOST:PORT)"
        ))
    };
    let listener = std::net::TcpListener::bind(addr).map_err(bad)?;
    listener.set_nonblocking(true).map_err(bad)?;
    TcpListener::from_std(listener).map_err(bad)
}

/// Accepts connections until shutdown; each gets its own task. Beyond `max_connections` open
/// ones, a new connection is closed at once (the peer sees it closed before any reply).
pub async fn accept_loop<E: Engine>(
    listener: TcpListener,
    engine: E,
    shared: Arc<Shared>,
    mut shutdown: Shutdown,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.recv() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let open = shared.metrics.open_connections();
                if shared.max_connections.is_some_and(|max| open >= max) {
                    shared.metrics.refused(Refusal::MaxConnections);
                    drop(stream);
                    if let Some(suppressed) = OVER_CAP_LOG.admit() {
                        tracing::warn!(%peer, open, suppressed,
                            "refused a connection: --max-connections are open");
                    }
                    continue;
                }
                if !NODELAY_INHERITED {
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, %err, "TCP_NODELAY failed");
                    }
                }
                let validate_within = shared.validate_within;
                let handler = Handler::new(stream, engine.clone(), Arc::clone(&shared))
                    .with_handshake_deadline(validate_within);
                tokio::spawn(handler.run(shutdown.clone()));
            }
            Err(err) => {
                // Out of descriptors or a connection reset before accept: back off briefly
                // rather than spin, and keep serving the connections we have.
                if let Some(suppressed) = ACCEPT_LOG.admit() {
                    tracing::warn!(%err, suppressed, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_binds_only_loopback_and_names_bind_everything() {
        let loopback = vec![SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 7)];
        assert_eq!(bind_addresses("localhost", 7), loopback);
        assert_eq!(bind_addresses("LocalHost.", 7), loopback);
        assert_eq!(bind_addresses("10.1.2.3", 7).len(), 1);
        let everything = bind_addresses("store-host", 7);
        assert!(everything.iter().all(|a| a.ip().is_unspecified()));
    }

    #[test]
    fn accepted_connections_have_nodelay() {
        let server = Server::start(&ServerConfig {
            host: "127.0.0.1".into(),
            port: 0,
            ..ServerConfig::default()
        })
        .unwrap();
        let client = std::net::TcpStream::connect(server.local_addr()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let nodelay = loop {
            if let Some(nodelay) = server_end_nodelay(client.local_addr().unwrap()) {
                break nodelay;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "server never accepted"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(nodelay, "the accepted socket lacks TCP_NODELAY");
    }

    /// TCP_NODELAY of this process's socket whose peer is `client` (the server's end).
    fn server_end_nodelay(client: SocketAddr) -> Option<bool> {
        use std::os::fd::BorrowedFd;
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // SAFETY: only borrowed for two getsockopt-style reads; a descriptor closed and
            // reused meanwhile by another test just fails the match below.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            let socket = socket2::SockRef::from(&borrowed);
            let peer = socket.peer_addr().ok().and_then(|a| a.as_socket());
            if peer == Some(client) {
                return socket.tcp_nodelay().ok();
            }
        }
        None
    }

    #[test]
    fn an_ip_literal_binds_only_itself_and_a_name_binds_everything() {
        assert_eq!(
            bind_addresses("127.0.0.1", 5),
            vec!["127.0.0.1:5".parse().unwrap()]
        );
        assert_eq!(bind_addresses("[::1]", 5), vec!["[::1]:5".parse().unwrap()]);
        assert_eq!(
            bind_addresses("0.0.0.0", 5),
            vec!["0.0.0.0:5".parse().unwrap()]
        );
        let everything = bind_addresses("some-host", 5);
        assert!(everything.iter().all(|a| a.ip().is_unspecified()));
        assert_eq!(everything.len(), 2);
    }
}
