//! This checkout's release `ferrodist-store`, built for the tests that measure it.
//!
//! A debug `cargo test` must not time a debug server (decoding one 100K-key request alone takes
//! tens of milliseconds there), nor whatever `ferrodist-store` happens to be on PATH: a stale one
//! there once passed the p99 tests, and its absence made them pass as skipped. So the tests
//! build the release binary of these very sources (a no-op when `scripts/_setup.sh` already
//! did) and take the path cargo reports for it; a failed build fails them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long building the release binary may take (a fresh build of every dependency took
/// about 4.5 minutes on this project's 2-core VM; an up-to-date one takes about a second).
const BUILD_WITHIN: Duration = Duration::from_secs(20 * 60);

/// The variables (by prefix) that cargo sets for a test run and not for a build of its own.
const SET_FOR_TESTS: [&str; 9] = [
    "CARGO_MANIFEST_",
    "CARGO_PKG_",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
    "RUST_TEST_",
];

/// Builds this checkout's `ferrodist-store` with the release profile (once per test process;
/// a no-op when the set-up already built it from these sources) and returns the path cargo
/// reports for it, wherever the target directory is. Panics, saying why, when it cannot.
pub fn release_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
        let mut build = Command::new(&cargo);
        // Without the variables cargo sets for a test run: build scripts (ring's) track some of
        // them, so with them this build and the set-up's would each rebuild what the other built.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if SET_FOR_TESTS.iter().any(|set| name.starts_with(set)) {
                build.env_remove(&*name);
            }
        }
        build
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--release", "--bin", "ferrodist-store"])
            .arg("--message-format=json-render-diagnostics")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        eprintln!("building this checkout's release ferrodist-store to measure it: {build:?}");
        let mut child = build
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"));
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
        });
        let began = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if began.elapsed() > BUILD_WITHIN {
                let _ = child.kill();
                let _ = child.wait();
                panic!("building the release ferrodist-store took over {BUILD_WITHIN:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let report = reader.join().unwrap().expect("cargo's report is text");
        assert!(
            status.success(),
            "building the release ferrodist-store failed ({status}; cargo's messages above): \
             the p99 tests measure this checkout's release build and nothing else"
        );
        let binary = artifact(&report, "ferrodist-store")
            .unwrap_or_else(|| panic!("cargo reported no ferrodist-store executable: {report}"));
        assert!(
            binary.is_file(),
            "cargo reported {binary:?}, which is not a file"
        );
        binary
    })
}

/// The executable of the binary target `name` in cargo's JSON messages.
fn artifact(report: &str, name: &str) -> Option<PathBuf> {
    let target = format!("\"name\":\"{name}\"");
    report
        .lines()
        .filter(|line| line.contains("\"reason\":\"compiler-artifact\"") && line.contains(&target))
        .find_map(|line| {
            let start = line.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = start + line[start..].find('"')?;
            Some(PathBuf::from(&line[start..end]))
        })
}
