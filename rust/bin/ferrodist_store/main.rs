//! `ferrodist-store`: the standalone TCPStore server.
//!
//! The same server a master `TCPStore` hosts in-process, for jobs that want the store to outlive
//! any rank. Stock torch clients (`TCPStore`, `init_method="tcp://..."`, torchrun's c10d
//! rendezvous) connect to it unchanged. It prints the address it listens on, then serves until
//! SIGTERM or SIGINT, and drains its connections before exiting. The wheel installs this very
//! binary (no Python in between), so it starts as fast from `pip install` as from cargo.
//!
//! What only this binary needs lives here, not in the library: `cli.rs` (the arguments, logging
//! and the run until a signal), `backend.rs` (`--backend` and the `--etcd-*` flags) and
//! `signals.rs` (SIGINT/SIGTERM held from `main`'s first instant). The server itself is the
//! library's [`ferrodist::tcp::server`], the same one a master `TCPStore` hosts.

mod backend;
mod cli;
mod signals;

use clap::Parser;

use crate::cli::{run_until_signal, ServerArgs};

fn main() -> std::process::ExitCode {
    // Before anything else: a SIGINT/SIGTERM from now on waits for the handlers instead of
    // killing the server mid-start.
    if let Err(err) = signals::hold() {
        eprintln!("ferrodist-store: cannot hold SIGINT/SIGTERM: {err}");
    }
    // `--help` and `--version` end here; clap ignores a closed stdout (`| head -1`).
    let args = ServerArgs::parse();
    match run_until_signal(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ferrodist-store: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
