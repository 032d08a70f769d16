//! The `ferrodist-store` command line: arguments, logging, and the run until a signal.
//!
//! The binary is the only way the server is started on its own (the wheel ships it as a
//! script), so nothing on this path loads Python or torch: it is listening within milliseconds
//! of `exec` and idles in a few MB.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;

use ferrodist::error::{Error, Result};
use ferrodist::store::db::Db;
use ferrodist::store::{EtcdEngine, EtcdStore};
use ferrodist::tcp::auth::AuthToken;
use ferrodist::tcp::codec::Limits;
use ferrodist::tcp::server::{Server, ServerConfig};
use ferrodist::tcp::store::WORKER_COUNTER_KEY;

use crate::backend::BackendArgs;
use crate::signals::Termination;

/// Command-line arguments of `ferrodist-store`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ferrodist-store",
    version,
    about = "A torch-compatible TCPStore server",
    // A flag given twice takes its last value (a wrapper script's defaults, then the user's).
    args_override_self = true
)]
pub struct ServerArgs {
    /// Address to bind: an IP literal binds only it; `::` or `0.0.0.0` every interface.
    #[arg(long, default_value = "::")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (printed at start).
    #[arg(long, short, default_value_t = 29500)]
    pub port: u16,
    /// Number of clients expected; the server logs when all have joined (torch's `init/`).
    #[arg(long)]
    pub world_size: Option<u64>,
    /// Seconds to wait for `--world-size` clients before warning.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Log filter for tracing (`error`, `warn`, `info`, `debug`, `trace` or a directive).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log line format on stderr: `text`, or `json` (one object per line) for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Largest value accepted, in bytes; a larger one closes that connection.
    #[arg(long, default_value_t = Limits::default().max_value_bytes)]
    pub max_value_bytes: u64,
    /// Largest request accepted, in bytes; a larger one closes that connection.
    #[arg(long, default_value_t = Limits::default().max_request_bytes)]
    pub max_request_bytes: u64,
    /// Serve Prometheus metrics on `GET /metrics` and a health check on `GET /healthz` at this
    /// `HOST:PORT` (port 0 picks one, printed at start). `GET /flight` shows, for the jobs this
    /// server serves, each rank's last completed collective and heartbeat age from their flight
    /// recorder summaries (also on `/metrics` as `ferrodist_flight_*`; with the in-memory
    /// backend only): host names, pids and call sites, readable by whoever reaches this address.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Admit only clients that prove they hold the token in this file (read once at start,
    /// whitespace trimmed). ferrodist's clients take it from `FERRODIST_STORE_TOKEN`,
    /// `FERRODIST_STORE_TOKEN_FILE` or `TCPStore(auth_token=...)`.
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// With `--auth-token-file`: still serve stock torch clients (torchrun's agent, say), which
    /// cannot present a token, but only from loopback unless `--torch-clients-from` names other
    /// networks. Such a client reads and writes every key, as a token holder does; everyone
    /// else must still prove the token.
    #[arg(long, requires = "auth_token_file")]
    pub allow_unauthenticated_torch_clients: bool,
    /// With `--allow-unauthenticated-torch-clients`: the networks (CIDR, comma-separated, e.g.
    /// `10.1.0.0/16,127.0.0.1/32`) stock torch clients are served from, instead of loopback.
    #[arg(
        long,
        value_name = "CIDR,...",
        value_delimiter = ',',
        requires = "allow_unauthenticated_torch_clients"
    )]
    pub torch_clients_from: Vec<ipnet::IpNet>,
    /// Close new connections at once while this many are open (those open are unaffected).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// Where the state lives (`--backend`, `--etcd-*`).
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured only when stderr is a terminal and `NO_COLOR` is unset.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Whether text logs get colour escapes: only on a terminal, and never with `NO_COLOR` set
/// (<https://no-color.org>), so a log redirected to a file stays plain text.
fn colour_logs() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Sets up tracing to stderr at `level` (ignored if a subscriber is already installed).
pub fn init_logging(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour_logs()).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// Runs the server described by `args` until SIGTERM or SIGINT, then drains it.
///
/// Call [`crate::signals::hold`] first thing in `main`: the handlers are installed here, and a
/// signal that arrives before that is kept for them rather than killing the process.
pub fn run_until_signal(args: &ServerArgs) -> Result<()> {
    init_logging(&args.log_level, args.log_format);
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| Error::InvalidArgument(format!("--timeout: bad seconds {}", args.timeout)))?;
    // Read once, before anything listens: a missing or empty file stops the start.
    let auth_token = args
        .auth_token_file
        .as_deref()
        .map(AuthToken::from_file)
        .transpose()?;
    let config = ServerConfig {
        auth_token,
        allow_unauthenticated_torch_clients: args.allow_unauthenticated_torch_clients,
        torch_clients_from: args.torch_clients_from.clone(),
        max_connections: args.max_connections,
        metrics_addr: args.metrics_addr.clone(),
        host: args.host.clone(),
        port: args.port,
        limits: Limits {
            max_value_bytes: args.max_value_bytes,
            max_request_bytes: args.max_request_bytes,
            ..Limits::default()
        },
        expected_clients: args.world_size,
        ..ServerConfig::default()
    };
    // Connected before the runtime is entered below (the store's connect blocks on it).
    let etcd = match args.backend.etcd_options()? {
        None => None,
        Some(options) => {
            let store = EtcdStore::connect(&options)?;
            tracing::info!(endpoints = ?options.endpoints, prefix = %options.prefix,
                "serving from etcd");
            Some(EtcdEngine::new(store))
        }
    };
    let runtime = ferrodist::runtime::runtime();
    let _entered = runtime.enter();
    // On this (the main) thread, inside the runtime: handlers first, then the held signals
    // are let through, so one sent at any point since exec is acted on.
    let mut stop = Termination::install()?;
    runtime.block_on(async {
        let server = match &etcd {
            None => Server::start(&config)?,
            Some(engine) => Server::start_with_engine(&config, engine.clone())?,
        };
        announce(&format!(
            "ferrodist-store listening on {}",
            server.local_addr()
        ));
        if let Some(addr) = server.metrics_addr() {
            announce(&format!("ferrodist-store metrics on http://{addr}/metrics"));
        }
        if let Some(world_size) = args.world_size {
            match &etcd {
                None => tokio::spawn(log_when_joined(server.db().clone(), world_size, timeout)),
                Some(backend) => {
                    tokio::spawn(log_when_joined_etcd(backend.clone(), world_size, timeout))
                }
            };
        }
        let signal = stop.received().await;
        tracing::info!(signal, "shutting down");
        server.shutdown(Duration::from_secs(5)).await;
        Ok(())
    })
}

/// Prints an address line on stdout for whoever started the server. A closed or broken
/// stdout (`ferrodist-store | head -1` after `head` exits, `>&-`) is no reason to stop
/// serving: the server logs its address too, so this only warns.
fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let printed = writeln!(out, "{line}").and_then(|()| out.flush());
    if let Err(err) = printed {
        tracing::warn!(%err, "could not print the address on stdout; serving anyway");
    }
}

async fn log_when_joined(db: Db, world_size: u64, timeout: Duration) {
    let key = Bytes::from_static(WORKER_COUNTER_KEY.as_bytes());
    let all = async {
        loop {
            match db.counter_at_least(&key, world_size as i64) {
                Ok(_) => return,
                Err(mut waiter) => waiter.released().await,
            }
        }
    };
    match tokio::time::timeout(timeout, all).await {
        Ok(()) => tracing::info!(world_size, "all clients joined"),
        Err(_) => tracing::warn!(
            world_size,
            joined = %String::from_utf8_lossy(&db.get(&key)),
            "not every client joined within the timeout"
        ),
    }
}

/// [`log_when_joined`] for a server whose state is in etcd: a watch of the worker counter.
async fn log_when_joined_etcd(engine: EtcdEngine, world_size: u64, timeout: Duration) {
    let all = engine
        .store()
        .wire_counter_at_least(WORKER_COUNTER_KEY.as_bytes(), world_size as i64);
    match tokio::time::timeout(timeout, all).await {
        Ok(Ok(())) => tracing::info!(world_size, "all clients joined"),
        Ok(Err(err)) => tracing::warn!(%err, "could not count the clients that joined"),
        Err(_) => tracing::warn!(world_size, "not every client joined within the timeout"),
    }
}
