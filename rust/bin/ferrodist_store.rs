//! `ferrodist-store`: the standalone TCPStore server.
//!
//! The same server a master `TCPStore` hosts in-process, for jobs that want the store to outlive
//! any rank. Stock torch clients (`TCPStore`, `init_method="tcp://..."`, torchrun's c10d
//! rendezvous) connect to it unchanged. It prints the address it listens on, then serves until
//! SIGTERM or SIGINT, and drains its connections before exiting.

use clap::Parser;
use ferrodist::tcp::cli::{run_until_signal, ServerArgs};

fn main() -> std::process::ExitCode {
    let args = ServerArgs::parse();
    match run_until_signal(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ferrodist-store: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
