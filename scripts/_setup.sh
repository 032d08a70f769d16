# Sourced by scripts/demo, scripts/test and scripts/bench: everything a fresh machine needs,
# done once.
#  1. a venv (.venv, or $FERRODIST_VENV) with torch and the test tools, created on first use and
#     reused after (torch is never reinstalled while the venv has the pinned version);
#  2. the Rust extension (maturin, cargo profile `extension`, placed in python/ferrodist/) and
#     the ferrodist-store server (cargo, profile `release`, in target/release/). The two
#     profiles keep the builds from invalidating each other, so with nothing changed both are
#     no-ops (about 1.5 s in all);
#  3. PYTHONPATH and PATH pointing at this checkout, so several checkouts can share one venv.
#  4. before all that, `etcd` from Debian where missing (etcd-server), a test-only dependency:
#     the EtcdStore tests start it as 3-member clusters on free loopback ports.
# The etcd-client crate's build script runs `protoc`: unless PROTOC is set, the one vendored
# from crates.io that the helper crate rust/protoc prints (as scripts/wheel_backend.py does for
# `pip install .`), so no system protoc is needed.
# A build that has work to do says so and shows cargo's lines as it goes (a first build compiles
# every dependency twice, once per profile: minutes); a no-op build prints nothing. A failed
# build stops the script, and so does an extension file that this build did not write.
# Nothing is installed into the venv: `pip install .` does that (README, Install).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if ! command -v etcd >/dev/null 2>&1; then
  echo "== installing etcd-server (apt-get; the EtcdStore tests start etcd)"
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends etcd-server
fi
VENV=${FERRODIST_VENV:-$REPO/.venv}
PY=$VENV/bin/python

if [ ! -x "$PY" ]; then
  echo "== creating the venv at $VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
fi
stamp=$VENV/.ferrodist-requirements.$(sha1sum "$REPO/requirements-dev.txt" | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "== installing torch and the test tools into $VENV (first run downloads several GB)"
  "$PY" -m pip install -q -r "$REPO/requirements-dev.txt"
  touch "$stamp"
fi

export VIRTUAL_ENV=$VENV
# This checkout's ferrodist-store first: a venv (shared by several checkouts) may hold an older
# one from a `pip install .`, which the tests would otherwise run in its place.
export PATH=$REPO/target/release:$VENV/bin:$PATH

if [ -z "${PROTOC:-}" ]; then
  protoc_helper=$REPO/rust/protoc/Cargo.toml
  [ -x "${CARGO_TARGET_DIR:-$REPO/rust/protoc/target}/debug/ferrodist-protoc" ] ||
    echo "== building rust/protoc (prints where the protoc vendored from crates.io is)"
  protoc_vars=$(cargo run -q --locked --manifest-path "$protoc_helper") ||
    { echo "== cargo run --manifest-path $protoc_helper failed; set PROTOC to a protoc" >&2; exit 1; }
  while IFS='=' read -r name value; do
    case $name in
      PROTOC) export PROTOC=$value ;;
      PROTOC_INCLUDE) export PROTOC_INCLUDE=${PROTOC_INCLUDE:-$value} ;;
    esac
  done <<<"$protoc_vars"
fi

# Passes a build's output through, minus maturin's emoji chatter; prints $1 before the first
# line that says work is being done, and nothing at all for a no-op (whose only line is cargo's
# "Finished"). Always exits 0, so `pipefail` reports the build's own status.
_build_output() {
  awk -v header="$1" '
    /^(📦|🔗|🐍|✏️|🛠|🍹|📡)/ || /build-backend/ { next }
    !shown && /Finished.*target\(s\) in/ { next }
    !shown { print header; shown = 1 }
    { print; fflush() }'
}
# Colour through the pipe when a person watches (cargo only colours a terminal).
color=${CARGO_TERM_COLOR:-auto}
if [ -t 2 ]; then color=${CARGO_TERM_COLOR:-always}; fi
first="(first build: every dependency, about 4 minutes on 2 cores; cargo's lines follow)"
what="== building the extension (maturin develop, cargo profile \`extension\`)"
ls "$REPO"/python/ferrodist/_native*.so >/dev/null 2>&1 || what="$what $first"
# maturin's exit status decides, and every extension file must be its work: maturin develop
# rewrites the extension on every successful run (a no-op build included), so one older than
# the moment the build began is stale, whether maturin wrote nothing or an earlier build left
# it under another name (python imports `_native.cpython-*.so` before `_native.abi3.so`).
build_began=$(mktemp)
(cd "$REPO" && CARGO_TERM_COLOR=$color maturin develop --skip-install 2>&1 | _build_output "$what") ||
  { rm -f "$build_began"; echo "== building the extension failed (maturin develop, output above)" >&2; exit 1; }
written=0
for so in "$REPO"/python/ferrodist/_native*.so; do
  [ -e "$so" ] || continue
  if [ "$so" -ot "$build_began" ]; then
    rm -f "$build_began"
    echo "== $so is older than this build: a stale extension maturin did not write; remove it and rerun" >&2
    exit 1
  fi
  written=1
done
rm -f "$build_began"
[ "$written" = 1 ] || { echo "== maturin develop succeeded but wrote no extension in python/ferrodist/" >&2; exit 1; }
what="== building ferrodist-store (cargo, profile \`release\`)"
[ -x "$REPO"/target/release/ferrodist-store ] || what="$what $first"
(cd "$REPO" && CARGO_TERM_COLOR=$color cargo build --release --bin ferrodist-store 2>&1 | _build_output "$what") ||
  { echo "== building ferrodist-store failed (cargo, output above)" >&2; exit 1; }
export PYTHONPATH=$REPO/python${PYTHONPATH:+:$PYTHONPATH}
