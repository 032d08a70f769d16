//! Prints where the `protoc` vendored by the `protoc-bin-vendored` crate lives, for builds on
//! machines without a system protoc.
//!
//! Output, one `NAME=VALUE` line each: `PROTOC=<path of the protoc binary>` and
//! `PROTOC_INCLUDE=<directory holding google/protobuf/*.proto>`, the two variables prost-build
//! (run by etcd-client's build script) reads. Exits 1 with a message on stderr on a platform
//! the crate ships no binary for.

use std::process::ExitCode;

fn main() -> ExitCode {
    let paths = protoc_bin_vendored::protoc_bin_path()
        .and_then(|protoc| Ok((protoc, protoc_bin_vendored::include_path()?)));
    match paths {
        Ok((protoc, include)) => {
            println!("PROTOC={}", protoc.display());
            println!("PROTOC_INCLUDE={}", include.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("ferrodist-protoc: {err}; install protoc and set PROTOC to its path");
            ExitCode::FAILURE
        }
    }
}
