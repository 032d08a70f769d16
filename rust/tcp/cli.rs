//! The `ferrodist-store` command line, shared by the cargo binary and the `ferrodist-store`
//! console script the wheel installs (a Python entry point that calls [`main_with_args`]), so
//! both run exactly the same server.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;

use super::codec::Limits;
use super::server::{Server, ServerConfig};
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
    /// Largest value accepted, in bytes; a larger one closes that connection.
    #[arg(long, default_value_t = Limits::default().max_value_bytes)]
    pub max_value_bytes: u64,
    /// Largest request accepted, in bytes; a larger one closes that connection.
    #[arg(long, default_value_t = Limits::default().max_request_bytes)]
    pub max_request_bytes: u64,
}

/// Sets up tracing to stderr at `level` (ignored if a subscriber is already installed).
pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// SIGTERM and SIGINT handlers, installed when built (so no signal is lost after that).
struct Termination {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Termination {
    fn install() -> Result<Termination> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Termination {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves with the signal's name once one arrives.
    async fn received(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Runs the server described by `args` until SIGTERM or SIGINT, then drains it.
pub fn run_until_signal(args: &ServerArgs) -> Result<()> {
    init_logging(&args.log_level);
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
    crate::runtime::runtime().block_on(async {
        // Signal handlers first, so a signal right after the address is printed is not lost.
        let mut stop = Termination::install()?;
        let server = Server::start(&config)?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ferrodist-store listening on {}", server.local_addr())?;
        out.flush()?;
        drop(out);
        if let Some(world_size) = args.world_size {
            tokio::spawn(log_when_joined(server.db().clone(), world_size, timeout));
        }
        let signal = stop.received().await;
        tracing::info!(signal, "shutting down");
        server.shutdown(Duration::from_secs(5)).await;
        Ok(())
    })
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

/// Parses `argv` (program name first) and runs the server; the console script's body.
pub fn main_with_args(argv: Vec<String>) -> Result<()> {
    match ServerArgs::try_parse_from(argv) {
        Ok(args) => run_until_signal(&args),
        Err(help) if !help.use_stderr() => {
            // --help / --version: print and succeed, as the binary does.
            print!("{help}");
            Ok(())
        }
        Err(err) => Err(Error::InvalidArgument(err.render().to_string())),
    }
}
