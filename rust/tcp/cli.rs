//! The `ferrodist-store` command line: arguments, logging, and the run until a signal.
//!
//! The binary is the only way the server is started on its own (the wheel ships it as a
//! script), so nothing on this path loads Python or torch: it is listening within milliseconds
//! of `exec` and idles in a few MB.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;

use super::codec::Limits;
use super::server::{Server, ServerConfig};
use super::signals::Termination;
use super::store::WORKER_COUNTER_KEY;
use crate::error::{Error, Result};

/// Command-line arguments of `ferrodist-store`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ferrodist-store",
    version,
    about = "A torch-compatible TCPStore server"
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
/// Call [`super::signals::hold`] first thing in `main`: the handlers are installed here, and a signal
/// that arrives before that is kept for them rather than killing the process.
pub fn run_until_signal(args: &ServerArgs) -> Result<()> {
    init_logging(&args.log_level, args.log_format);
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| Error::InvalidArgument(format!("--timeout: bad seconds {}", args.timeout)))?;
    let config = ServerConfig {
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
    let runtime = crate::runtime::runtime();
    let _entered = runtime.enter();
    // On this (the main) thread, inside the runtime: handlers first, then the held signals
    // are let through, so one sent at any point since exec is acted on.
    let mut stop = Termination::install()?;
    runtime.block_on(async {
        let server = Server::start(&config)?;
        announce(&server.local_addr().to_string());
        if let Some(world_size) = args.world_size {
            tokio::spawn(log_when_joined(server.db().clone(), world_size, timeout));
        }
        let signal = stop.received().await;
        tracing::info!(signal, "shutting down");
        server.shutdown(Duration::from_secs(5)).await;
        Ok(())
    })
}

/// Prints the address line on stdout for whoever started the server. A closed or broken
/// stdout (`ferrodist-store | head -1` after `head` exits, `>&-`) is no reason to stop
/// serving: the server logs its address too, so this only warns.
fn announce(addr: &str) {
    let mut out = std::io::stdout().lock();
    let printed = writeln!(out, "ferrodist-store listening on {addr}").and_then(|()| out.flush());
    if let Err(err) = printed {
        tracing::warn!(%err, "could not print the address on stdout; serving anyway");
    }
}

async fn log_when_joined(db: crate::store::db::Db, world_size: u64, timeout: Duration) {
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
