//! This build's `ferrodist-store` as a child process, for tests that kill and restart a server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferrodist::tcp::{TcpStore, TcpStoreOptions};

use super::etcd::EtcdCluster;

/// `ferrodist-store` on 127.0.0.1:`port` (0: one it picks), with its state in the shared etcd
/// cluster under `etcd_prefix` when given (in memory otherwise), once it listens; and the port
/// it listens on (read from its first line, so no port is picked here and taken meanwhile).
pub fn spawn_store(port: u16, etcd_prefix: Option<&str>) -> (Child, u16) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ferrodist-store"));
    command
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--log-level", "warn"]);
    if let Some(prefix) = etcd_prefix {
        let endpoints = EtcdCluster::shared_endpoints().join(",");
        command.args(["--backend", &format!("etcd://{endpoints}/{prefix}")]);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening = line
        .strip_prefix("ferrodist-store listening on ")
        .and_then(|addr| addr.trim().rsplit(':').next())
        .and_then(|port| port.parse().ok());
    match listening {
        Some(port) => (child, port),
        None => panic!("got {line:?}"),
    }
}

/// ferrodist's client (torch's wire sequences) to the server on 127.0.0.1:`port`, 30 s timeout.
pub fn store_client(port: u16) -> TcpStore {
    TcpStore::new(TcpStoreOptions {
        port,
        timeout: Duration::from_secs(30),
        wait_for_workers: false,
        ..TcpStoreOptions::default()
    })
    .expect("connects")
}
