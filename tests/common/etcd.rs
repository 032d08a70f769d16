//! A real etcd cluster for the integration tests: members on free loopback ports in a temp
//! directory, killed (SIGKILL) and restarted on demand, stopped on drop.
//!
//! Needs `etcd` on PATH (Debian's `etcd-server`; scripts/_setup.sh installs it). Data goes to
//! /dev/shm where it exists, so etcd's fsync per write does not slow the shared test machine;
//! a killed member still keeps what it acknowledged (the page cache outlives the process).

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Endpoints of the cluster most tests share (one per test binary), and its directory.
static SHARED: OnceLock<(Vec<String>, PathBuf)> = OnceLock::new();

extern "C" fn remove_shared_data() {
    if let Some((_, root)) = SHARED.get() {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// One member: its ports and, while it runs, its process.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// A running cluster; dropping it kills every member and removes the data.
pub struct EtcdCluster {
    members: Vec<Member>,
    root: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn scratch_dir() -> tempfile::TempDir {
    let fast = Path::new("/dev/shm");
    if fast.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("etcd-").tempdir_in(fast) {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix("etcd-")
        .tempdir()
        .expect("temp dir")
}

impl EtcdCluster {
    /// The endpoints of a 3-member cluster shared by the tests of this binary, started on
    /// first use and stopped when the process exits. Tests keep apart by prefix.
    pub fn shared_endpoints() -> Vec<String> {
        let (endpoints, _) = SHARED.get_or_init(|| {
            // Members die with the thread that started them (PR_SET_PDEATHSIG), so a thread
            // that lives as long as the process starts and keeps them.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let cluster = EtcdCluster::start(3);
                let root = cluster.root.path().to_path_buf();
                tx.send((cluster.endpoints(), root))
                    .expect("test thread waits");
                let _keep = cluster;
                loop {
                    std::thread::park();
                }
            });
            let shared = rx.recv().expect("the shared etcd cluster starts");
            // SAFETY: registering a plain extern "C" function that captures nothing.
            unsafe { libc::atexit(remove_shared_data) };
            shared
        });
        endpoints.clone()
    }

    /// Starts `size` members and waits until the cluster has a leader. Ports are picked free
    /// and then bound by etcd, so another test's cluster starting at the same moment can take
    /// one first: a cluster not ready in time is stopped and started again on fresh ports.
    pub fn start(size: usize) -> EtcdCluster {
        for attempt in 1..=3 {
            let members = (0..size)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    process: None,
                })
                .collect();
            let mut cluster = EtcdCluster {
                members,
                root: scratch_dir(),
            };
            for i in 0..size {
                cluster.start_member(i);
            }
            if cluster.ready_within(Duration::from_secs(30)) {
                return cluster;
            }
            eprintln!("etcd cluster not ready within 30 s (attempt {attempt}); new ports");
        }
        panic!("etcd cluster not ready within 30 s, three times");
    }

    /// Every member's `127.0.0.1:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.root.path().join(&self.members[i].name)
    }

    fn start_member(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let data = self.data_dir(i);
        // A token of this cluster's own, so members of two clusters never join each other.
        let token = self
            .root
            .path()
            .file_name()
            .map_or_else(|| "ferrodist".into(), |n| n.to_string_lossy().into_owned());
        let log = std::fs::File::create(self.root.path().join(format!("{}.log", m.name)))
            .expect("log file");
        let mut command = Command::new("etcd");
        // SAFETY: prctl is async-signal-safe; the member dies with the test process even if
        // the process never gets to clean up (a crash, a SIGKILL).
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args([
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &token,
            ])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd on PATH (Debian: apt-get install etcd-server)");
        self.members[i].process = Some(child);
    }

    /// Until every running member accepts connections and one of them leads.
    pub fn wait_ready(&self) {
        assert!(
            self.ready_within(Duration::from_secs(30)),
            "etcd cluster not ready within 30 s"
        );
    }

    /// Whether every running member accepts connections and one of them leads within `limit`.
    fn ready_within(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let up = self
                .running()
                .iter()
                .all(|&i| TcpStream::connect(("127.0.0.1", self.members[i].client_port)).is_ok());
            if up && self.leader().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Indices of the members whose process runs.
    pub fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].process.is_some())
            .collect()
    }

    /// Index of the current leader, asked of each running member.
    pub fn leader(&self) -> Option<usize> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            for i in self.running() {
                let endpoint = format!("127.0.0.1:{}", self.members[i].client_port);
                let probe = async {
                    let mut client = etcd_client::Client::connect([endpoint], None).await.ok()?;
                    let status = client.status().await.ok()?;
                    let header = status.header()?;
                    (status.leader() != 0 && status.leader() == header.member_id()).then_some(i)
                };
                if let Ok(Some(i)) = tokio::time::timeout(Duration::from_secs(1), probe).await {
                    return Some(i);
                }
            }
            None
        })
    }

    /// SIGKILLs member `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.start_member(i);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A prefix no other test of this process uses (`what` names the test file), so tests sharing
/// the cluster never see each other's keys.
pub fn fresh_job(what: &str) -> String {
    static JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{what}-{}-{n}", std::process::id())
}

/// An `EtcdStore` on the shared cluster under `prefix`, without login or TLS.
pub fn shared_store(prefix: &str) -> ferrodist::store::etcd::EtcdStore {
    ferrodist::store::etcd::EtcdStore::connect(&ferrodist::store::etcd::EtcdOptions {
        endpoints: EtcdCluster::shared_endpoints(),
        prefix: prefix.to_owned(),
        timeout: Duration::from_secs(10),
        user: None,
        tls: None,
    })
    .expect("connects to etcd")
}
