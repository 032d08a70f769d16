//! Rendezvous storm: N clients hit one TCPStore server at once, the way N ranks do at job start.
//!
//! Each client connects, does torch's handshake (VALIDATE, then PING and its echo), adds 1 to a
//! counter, waits for a key that the last arrival sets, then gets that key. The generator speaks
//! the wire bytes itself (torch-store-protocol.md §3 and §5.1) instead of going through
//! ferrodist's client, so it is an independent peer that loads torch's servers and ours the
//! same way, and so a client costs one small task and one socket, which keeps the generator (not
//! the server) from being what a 2-core machine measures.
//!
//! Run: `cargo bench --bench storm -- --addr 127.0.0.1:PORT --clients 4096`. It prints one JSON
//! line of results, then `HOLD` while every connection stays open (so the caller can read the
//! server's memory with all clients connected), and exits when a line arrives on stdin.
//! `benches/bench_tcp_store.py` drives it against torch's libuv server and `ferrodist-store`.

use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

mod wire;
use wire::{ADD, GET, MAGIC, PING, SET, STOP_WAITING, VALIDATE, WAIT};

const JOINED_KEY: &str = "/storm/joined";
const GO_KEY: &str = "/storm/go";
const GO_VALUE: &[u8] = b"go";

/// Command-line options; see `usage()`.
struct Options {
    addr: SocketAddr,
    clients: u64,
    /// Spread client source addresses over 127.0.0.2 .. 127.0.0.(1+n); 0 lets the kernel choose.
    source_ips: u32,
    deadline: Duration,
    threads: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: storm --addr HOST:PORT --clients N [--source-ips K] [--deadline-s S] [--threads T]"
    );
    std::process::exit(2);
}

fn parse_options() -> Options {
    let mut opts = Options {
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 29500)),
        clients: 1024,
        source_ips: 0,
        deadline: Duration::from_secs(120),
        threads: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter().filter(|a| *a != "--bench");
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--addr" => opts.addr = value.parse().unwrap_or_else(|_| usage()),
            "--clients" => opts.clients = value.parse().unwrap_or_else(|_| usage()),
            "--source-ips" => opts.source_ips = value.parse().unwrap_or_else(|_| usage()),
            "--deadline-s" => {
                opts.deadline = Duration::from_secs_f64(value.parse().unwrap_or_else(|_| usage()))
            }
            "--threads" => opts.threads = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    opts
}

/// Raises the soft open-file limit to the hard one: 16384 clients need 16384 descriptors.
fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            return lim.rlim_cur;
        }
    }
    0
}

fn put_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s);
}

/// Counters shared by every client task.
#[derive(Default)]
struct Tally {
    connect_retries: AtomicU64,
    failures: AtomicU64,
    /// Slowest single client, connect to GET reply, in microseconds.
    slowest_us: AtomicU64,
}

async fn connect(opts: &Options, index: u64, tally: &Tally) -> std::io::Result<TcpStream> {
    let mut backoff = Duration::from_millis(50);
    loop {
        let socket = TcpSocket::new_v4()?;
        if opts.source_ips > 0 {
            let last = 2 + (index % u64::from(opts.source_ips)) as u8;
            socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))?;
        }
        match socket.connect(opts.addr).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            // Refused or reset: the listen backlog overflowed. Retry like torch's client does,
            // until the task's deadline (see `storm`) gives up on this client.
            Err(_) => {
                tally.connect_retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 3 / 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// One rank's rendezvous. Returns the open connection so the caller can hold it.
async fn rendezvous(
    opts: Arc<Options>,
    index: u64,
    tally: Arc<Tally>,
) -> std::io::Result<TcpStream> {
    let started = Instant::now();
    let mut stream = connect(&opts, index, &tally).await?;
    let nonce = (index as u32).wrapping_mul(2_654_435_761);
    let mut req = Vec::with_capacity(64);
    // VALIDATE and PING in one write, as a single segment (libuv needs the 5 VALIDATE bytes whole).
    req.push(VALIDATE);
    req.extend_from_slice(&MAGIC.to_le_bytes());
    req.push(PING);
    req.extend_from_slice(&nonce.to_le_bytes());
    stream.write_all(&req).await?;
    let echo = stream.read_u32_le().await?;
    if echo != nonce {
        return Err(std::io::Error::other(format!(
            "ping echo {echo} != {nonce}"
        )));
    }

    req.clear();
    req.push(ADD);
    put_str(&mut req, JOINED_KEY.as_bytes());
    req.extend_from_slice(&1i64.to_le_bytes());
    stream.write_all(&req).await?;
    let joined = stream.read_i64_le().await?;

    req.clear();
    if joined as u64 == opts.clients {
        req.push(SET);
        put_str(&mut req, GO_KEY.as_bytes());
        put_str(&mut req, GO_VALUE);
    }
    req.push(WAIT);
    req.extend_from_slice(&1u64.to_le_bytes());
    put_str(&mut req, GO_KEY.as_bytes());
    stream.write_all(&req).await?;
    let reply = stream.read_u8().await?;
    if reply != STOP_WAITING {
        return Err(std::io::Error::other(format!("wait reply {reply}")));
    }

    req.clear();
    req.push(GET);
    put_str(&mut req, GO_KEY.as_bytes());
    stream.write_all(&req).await?;
    let len = stream.read_u64_le().await?;
    if len != GO_VALUE.len() as u64 {
        return Err(std::io::Error::other(format!("get returned {len} bytes")));
    }
    let mut value = [0u8; 2];
    stream.read_exact(&mut value).await?;
    if value != GO_VALUE {
        return Err(std::io::Error::other("get returned the wrong value"));
    }
    let us = started.elapsed().as_micros() as u64;
    tally.slowest_us.fetch_max(us, Ordering::Relaxed);
    Ok(stream)
}

async fn storm(opts: Arc<Options>) -> (Duration, Vec<TcpStream>, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..opts.clients {
        let (opts, tally) = (Arc::clone(&opts), Arc::clone(&tally));
        let deadline = opts.deadline;
        tasks.spawn(async move {
            let outcome =
                tokio::time::timeout(deadline, rendezvous(opts, index, Arc::clone(&tally))).await;
            match outcome {
                Ok(Ok(stream)) => Some(stream),
                Ok(Err(e)) => {
                    if tally.failures.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!("storm: client {index} failed: {e}");
                    }
                    None
                }
                Err(_) => {
                    tally.failures.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        });
    }
    let mut held = Vec::with_capacity(opts.clients as usize);
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Some(stream)) = joined {
            held.push(stream);
        }
    }
    (started.elapsed(), held, tally)
}

fn main() {
    let opts = Arc::new(parse_options());
    let fd_limit = raise_fd_limit();
    let runtime = if opts.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads)
            .enable_all()
            .build()
    }
    .expect("building the generator's runtime");
    let (wall, held, tally) = runtime.block_on(storm(Arc::clone(&opts)));
    println!(
        "{{\"clients\": {}, \"wall_s\": {:.4}, \"failures\": {}, \"connect_retries\": {}, \
         \"slowest_client_s\": {:.4}, \"fd_limit\": {}}}",
        opts.clients,
        wall.as_secs_f64(),
        tally.failures.load(Ordering::Relaxed),
        tally.connect_retries.load(Ordering::Relaxed),
        tally.slowest_us.load(Ordering::Relaxed) as f64 / 1e6,
        fd_limit
    );
    println!("HOLD");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    runtime.block_on(async move { drop(held) });
}
