//! One client's large requests must not hold up another's small ones (issue 17): while one
//! connection sends MULTI_GETs of 100K keys, WAITs on 100K keys, runs of 4 KiB appends
//! or 8 MiB values, another's small SET + GET round trips keep their p99 within 100 ms of what
//! they were with the server to themselves.
//!
//! The small client is open-loop: it means to start an op every 4 ms and each op's
//! latency runs from when it was due, not from when it was sent. A closed-loop client that
//! sends the next op when the last returns sees only one slow op per stall, so a stall of a
//! second every 30 ms hid under its p99 (2.9 ms) while its slowest op took 1.25 s.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::release_build::release_binary;
use common::{frames, raw_to, read_n, start_server};
use ferrodist::tcp::codec::Request;
use ferrodist::tcp::Server;

/// How long each measurement of the small client runs (under load: at least this long, and
/// until the large client has had 3 requests answered).
const MEASURE_FOR: Duration = Duration::from_millis(1500);
/// Keys in one large MULTI_GET or WAIT.
const MANY_KEYS: usize = 100_000;
/// How much more the small client's p99 may be under load. This test guards against
/// starvation, the stalls of 0.5-1.2 s (MULTI_GET) and 40-390 ms (WAIT) that a connection's
/// large requests once put on everyone else; the fixed server's finer figure (2-9 ms on a
/// quiet 2-core VM) is a measurement for benches/RESULTS.md, not an assertion: this VM's own
/// scheduling has put 10-86 ms into single attempts of an unchanged server.
const P99_BUDGET: Duration = Duration::from_millis(100);
/// Measurements per load before it counts as failed: a shared machine's own stalls (tens of ms
/// on this project's loaded 2-core VM, with no load at all) come and go; a server that stalls
/// others fails every attempt.
const ATTEMPTS: usize = 5;

fn key(prefix: &str, i: usize) -> Bytes {
    Bytes::from(format!("/{prefix}-{i:010}"))
}

/// The small client starts an op this often.
const EVERY: Duration = Duration::from_millis(4);

/// The small client's latencies, each from when its op was due: SET an 8-byte value and GET it
/// back in one write, an op due every EVERY, for MEASURE_FOR and until `done` says so.
fn small_round_trips(server: SocketAddr, done: impl Fn() -> bool) -> Vec<Duration> {
    let mut stream = raw_to(server, true);
    let request = frames(&[
        Request::Set {
            key: Bytes::from_static(b"/small"),
            value: Bytes::from_static(b"12345678"),
        },
        Request::Get {
            key: Bytes::from_static(b"/small"),
        },
    ]);
    let mut times = Vec::new();
    let began = Instant::now();
    let mut due = began;
    while began.elapsed() < MEASURE_FOR || !done() {
        if let Some(early) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(early);
        }
        stream.write_all(&request).unwrap();
        assert_eq!(read_n(&stream, 16)[8..], *b"12345678");
        times.push(due.elapsed());
        due += EVERY;
    }
    times
}

fn p99(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() * 99 / 100]
}

/// One kind of large request, sent over and over, each answered before the next.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// MULTI_GET of MANY_KEYS stored keys.
    MultiGet,
    /// WAIT on MANY_KEYS missing keys, then CANCEL_WAIT.
    WaitOnMissing,
    /// WAIT on MANY_KEYS stored keys and one the same connection then sets.
    WaitOnStored,
    /// 1,000 appends of 4 KiB, then DELETE_KEY.
    Appends,
    /// SET of an 8 MiB value, then GET of it.
    BigValue,
}

impl Load {
    /// The request bytes of one round and the reply bytes that end it.
    fn round(self) -> (Vec<u8>, usize) {
        match self {
            Load::MultiGet => {
                let keys = (0..MANY_KEYS).map(|i| key("stored", i)).collect();
                (frames(&[Request::MultiGet { keys }]), MANY_KEYS * (8 + 8))
            }
            Load::WaitOnMissing => {
                let keys = (0..MANY_KEYS).map(|i| key("missing", i)).collect();
                (frames(&[Request::Wait { keys }, Request::CancelWait]), 1)
            }
            Load::WaitOnStored => {
                let go = Bytes::from_static(b"/go");
                let mut keys: Vec<Bytes> = (0..MANY_KEYS).map(|i| key("stored", i)).collect();
                keys.push(go.clone());
                let requests = [
                    Request::DeleteKey { key: go.clone() },
                    Request::Wait { keys },
                    // A stock client's request behind its pending WAIT is applied at once.
                    Request::Set {
                        key: go,
                        value: Bytes::from_static(b"1"),
                    },
                ];
                (frames(&requests), 8 + 1)
            }
            Load::Appends => {
                let chunk = Bytes::from(vec![b'a'; 4096]);
                let mut requests: Vec<Request> = (0..1000)
                    .map(|_| Request::Append {
                        key: Bytes::from_static(b"/log"),
                        value: chunk.clone(),
                    })
                    .collect();
                requests.push(Request::DeleteKey {
                    key: Bytes::from_static(b"/log"),
                });
                (frames(&requests), 8)
            }
            Load::BigValue => {
                let value = Bytes::from(vec![b'v'; 8 << 20]);
                let requests = [
                    Request::Set {
                        key: Bytes::from_static(b"/big"),
                        value,
                    },
                    Request::Get {
                        key: Bytes::from_static(b"/big"),
                    },
                ];
                (frames(&requests), 8 + (8 << 20))
            }
        }
    }

    /// Sends rounds on a connection of its own until `stop`, counting those answered.
    fn run(
        self,
        server: SocketAddr,
        stop: Arc<AtomicBool>,
        rounds: Arc<AtomicUsize>,
    ) -> std::thread::JoinHandle<()> {
        let mut stream: TcpStream = raw_to(server, true);
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        std::thread::spawn(move || {
            let (request, reply) = self.round();
            while !stop.load(Ordering::Relaxed) {
                stream.write_all(&request).unwrap();
                read_n(&stream, reply);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        })
    }
}

/// The server under measurement, always this checkout's code, optimized: an optimized build of
/// these tests measures a server in this process; a debug build (the suite's `cargo test`, in
/// which decoding one 100K-key request alone takes tens of milliseconds) measures this
/// checkout's release `ferrodist-store`, which `common::release_build` builds first. Never a binary
/// found on PATH (a stale one there once passed these tests), and never a skip: a build that
/// fails fails the tests. FERRODIST_P99_TESTS=1 measures the debug server in process anyway.
/// They pass on this project's 2-core VM: the 40-240 ms once blamed on its few cores came from
/// the server (a yield that left the I/O driver unpolled; see `runtime::yield_turn`).
enum Measured {
    InProcess(Server),
    Process(Child, SocketAddr),
}

impl Measured {
    fn start() -> Measured {
        if !cfg!(debug_assertions) || std::env::var_os("FERRODIST_P99_TESTS").is_some() {
            return Measured::InProcess(start_server());
        }
        let binary = release_binary();
        let mut child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "warn"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{binary:?} does not start: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("ferrodist-store listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from {binary:?}: {line:?}"));
        Measured::Process(child, addr)
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Measured::InProcess(server) => server.local_addr(),
            Measured::Process(_, addr) => *addr,
        }
    }
}

impl Drop for Measured {
    fn drop(&mut self) {
        if let Measured::Process(child, _) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One test at a time: they measure latency, and two at once would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Asserts that `load` on one connection moves the small client's p99 by at most P99_BUDGET.
fn small_p99_holds_beside(load: Load) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let measured = Measured::start();
    let server = measured.addr();
    let mut setup = raw_to(server, true);
    let pairs = (0..MANY_KEYS)
        .map(|i| (key("stored", i), Bytes::from_static(b"8 bytes!")))
        .collect();
    setup
        .write_all(&frames(&[Request::MultiSet { pairs }, Request::GetNumKeys]))
        .unwrap();
    read_n(&setup, 8);
    small_round_trips(server, || true); // warm-up
    let mut attempts = Vec::new();
    let mut within = false;
    while !within && attempts.len() < ATTEMPTS {
        let (alone, loaded, rounds) = measure(server, load);
        attempts.push(format!(
            "{alone:?} alone, {loaded:?} beside {rounds} requests"
        ));
        assert!(rounds > 0, "{load:?}: no large request was answered");
        within = loaded <= alone + P99_BUDGET;
    }
    let line = format!("{load:?}: p99 {}", attempts.join("; "));
    eprintln!("{line}");
    drop(measured);
    assert!(within, "the small client's p99 rose by over 100 ms: {line}");
}

#[test]
fn a_wait_on_100k_missing_keys_then_cancel_moves_anothers_p99_by_under_100_ms() {
    small_p99_holds_beside(Load::WaitOnMissing);
}

#[test]
fn a_wait_on_100k_stored_keys_moves_anothers_p99_by_under_100_ms() {
    small_p99_holds_beside(Load::WaitOnStored);
}

#[test]
fn runs_of_4_kib_appends_move_anothers_p99_by_under_100_ms() {
    small_p99_holds_beside(Load::Appends);
}

#[test]
fn setting_and_getting_8_mib_values_moves_anothers_p99_by_under_100_ms() {
    small_p99_holds_beside(Load::BigValue);
}

/// Was 0.5-1.2 s on this project's 2-core VM (and 20-300 ms on an idle 16-core machine) while
/// the connection sending MULTI_GETs kept the one runtime worker for 128 socket operations at a
/// time; now a connection yields after `WORK_SLICE` of work (`tcp/server/work_slice.rs`).
#[test]
fn a_multi_get_of_100k_keys_moves_anothers_p99_by_under_100_ms() {
    small_p99_holds_beside(Load::MultiGet);
}

/// The small client's p99 alone, then beside `load`, and how many large requests were
/// answered meanwhile.
fn measure(server: SocketAddr, load: Load) -> (Duration, Duration, usize) {
    let alone = p99(small_round_trips(server, || true));
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let big = load.run(server, stop.clone(), rounds.clone());
    let loaded = p99(small_round_trips(server, || {
        rounds.load(Ordering::Relaxed) >= 3
    }));
    stop.store(true, Ordering::Relaxed);
    big.join().unwrap();
    (alone, loaded, rounds.load(Ordering::Relaxed))
}

/// The server these tests measure is this checkout's, whatever PATH holds: with a stale
/// `ferrodist-store` first on PATH (one that records that it ran), a run of
/// [`probe_the_measured_server`] in a process of its own measures a server that answers, and
/// the stale binary never runs. (It once was the one measured, and its absence a skip.)
#[test]
fn a_ferrodist_store_on_path_is_never_the_one_measured() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("the-stale-binary-ran");
    let stale = dir.path().join("ferrodist-store");
    std::fs::write(
        &stale,
        format!(
            "#!/bin/sh\ntouch '{}'\necho 'ferrodist-store listening on 127.0.0.1:9'\nexit 1\n",
            ran.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&stale, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        std::iter::once(dir.path().to_path_buf()).chain(std::env::split_paths(&path)),
    )
    .unwrap();
    let probe = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "probe_the_measured_server",
            "--ignored",
            "--nocapture",
        ])
        .env("PATH", path)
        .output()
        .expect("the test binary runs");
    let said = String::from_utf8_lossy(&probe.stdout).into_owned()
        + &String::from_utf8_lossy(&probe.stderr);
    assert!(!ran.exists(), "the ferrodist-store on PATH was run: {said}");
    assert!(probe.status.success(), "the probe failed: {said}");
    assert!(
        said.contains("probe: measured "),
        "the probe did not run: {said}"
    );
    assert!(!said.contains(&dir.path().display().to_string()), "{said}");
}

/// Starts the server the p99 tests measure, checks that it answers a SET + GET, and says which
/// it is. Run by [`a_ferrodist_store_on_path_is_never_the_one_measured`].
#[test]
#[ignore = "run by a_ferrodist_store_on_path_is_never_the_one_measured, with a stale binary on PATH"]
fn probe_the_measured_server() {
    let measured = Measured::start();
    let stream = raw_to(measured.addr(), true);
    let request = frames(&[
        Request::Set {
            key: Bytes::from_static(b"/probe"),
            value: Bytes::from_static(b"12345678"),
        },
        Request::Get {
            key: Bytes::from_static(b"/probe"),
        },
    ]);
    (&stream).write_all(&request).unwrap();
    assert_eq!(read_n(&stream, 16)[8..], *b"12345678");
    match &measured {
        Measured::InProcess(_) => eprintln!("probe: measured a server in this process"),
        Measured::Process(..) => eprintln!("probe: measured {:?}", release_binary()),
    }
}
