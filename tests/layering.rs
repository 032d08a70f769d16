//! The crate's layer rules, checked on its sources (issue 29, item 8): the core never names
//! pyo3 (only `rust/python/`, the bindings, does, and `lib.rs` declares that module behind the
//! `python` feature), and every `.rs` file under `rust/` opens with a `//!` module doc that says
//! what it is. The scanner is tested on planted trees too, so a rule that cannot fail shows.

use std::fs;
use std::path::{Path, PathBuf};

/// The bindings' directory under `rust/`: the one place that may name pyo3.
const BINDINGS: &str = "python";
/// The line that declares the bindings in `lib.rs`, and the gate that must stand right above it.
const BINDINGS_MOD: &str = "pub mod python;";
const BINDINGS_GATE: &str = "#[cfg(feature = \"python\")]";

/// Every `.rs` file under `dir`, sorted, skipping cargo `target` directories (build output).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The rules broken under `rust_dir` (a crate's `rust/`), one `rust/PATH:LINE: what` each.
fn violations(rust_dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(rust_dir, &mut files);
    let mut found = Vec::new();
    for path in files {
        let rel = path.strip_prefix(rust_dir).expect("under rust_dir");
        let shown = format!("rust/{}", rel.display());
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {shown}: {e}"));
        if !text.starts_with("//!") {
            found.push(format!("{shown}:1: does not open with a `//!` module doc"));
        }
        let is_lib = rel == Path::new("lib.rs");
        if rel.starts_with(BINDINGS) {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            // lib.rs's crate doc states the rule (and names PyO3 to do so): its `//!` lines may.
            let crate_doc = is_lib && trimmed.starts_with("//!");
            if !crate_doc && trimmed.to_ascii_lowercase().contains("pyo3") {
                found.push(format!(
                    "{shown}:{}: names pyo3 outside rust/{BINDINGS}/: {trimmed}",
                    index + 1
                ));
            }
            if is_lib && trimmed == BINDINGS_MOD {
                let above = lines[..index]
                    .iter()
                    .rev()
                    .map(|l| l.trim())
                    .find(|l| !l.is_empty());
                if above != Some(BINDINGS_GATE) {
                    found.push(format!(
                        "{shown}:{}: `{BINDINGS_MOD}` without `{BINDINGS_GATE}` right above it",
                        index + 1
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn the_core_never_names_pyo3_and_every_file_has_a_module_doc() {
    let rust_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust");
    let found = violations(&rust_dir);
    assert!(
        found.is_empty(),
        "layer rules broken:\n{}",
        found.join("\n")
    );
}

/// Writes `files` (path under `rust/`, contents) into a fresh temporary crate directory.
fn planted(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, text) in files {
        let path = dir.path().join("rust").join(path);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create the directories");
        fs::write(path, text).expect("write a planted file");
    }
    dir
}

const LIB: &str = "//! A crate. The core never imports PyO3.\n\npub mod store;\n\n\
                   #[cfg(feature = \"python\")]\npub mod python;\n";

#[test]
fn a_tree_that_keeps_the_rules_passes() {
    let dir = planted(&[
        ("lib.rs", LIB),
        ("store/mod.rs", "//! Stores.\n\npub fn get() {}\n"),
        ("python/mod.rs", "//! Bindings.\n\nuse pyo3::prelude::*;\n"),
        ("protoc/target/debug/build/out.rs", "no doc, build output\n"),
    ]);
    assert_eq!(violations(&dir.path().join("rust")), Vec::<String>::new());
}

#[test]
fn a_planted_pyo3_name_in_the_core_is_found_with_its_file_and_line() {
    let dir = planted(&[
        ("lib.rs", LIB),
        ("store/mod.rs", "//! Stores.\n\nuse pyo3::prelude::*;\n"),
        (
            "tcp/server.rs",
            "//! The server.\n// a PyO3 type would do here\nfn serve() {}\n",
        ),
        ("python/mod.rs", "//! Bindings.\n\nuse pyo3::prelude::*;\n"),
    ]);
    assert_eq!(
        violations(&dir.path().join("rust")),
        [
            "rust/store/mod.rs:3: names pyo3 outside rust/python/: use pyo3::prelude::*;",
            "rust/tcp/server.rs:2: names pyo3 outside rust/python/: // a PyO3 type would do here",
        ]
    );
}

#[test]
fn a_file_without_a_module_doc_is_found() {
    let dir = planted(&[
        ("lib.rs", LIB),
        (
            "store/mod.rs",
            "/// An item doc is not a module doc.\npub fn get() {}\n",
        ),
        ("python/store.rs", "use pyo3::prelude::*;\n"),
    ]);
    assert_eq!(
        violations(&dir.path().join("rust")),
        [
            "rust/python/store.rs:1: does not open with a `//!` module doc",
            "rust/store/mod.rs:1: does not open with a `//!` module doc",
        ]
    );
}

#[test]
fn bindings_declared_without_the_feature_gate_are_found() {
    let lib = "//! A crate.\n\n#[cfg(test)]\npub mod python;\n";
    let dir = planted(&[("lib.rs", lib), ("python/mod.rs", "//! Bindings.\n")]);
    assert_eq!(
        violations(&dir.path().join("rust")),
        ["rust/lib.rs:4: `pub mod python;` without `#[cfg(feature = \"python\")]` right above it"]
    );
}
