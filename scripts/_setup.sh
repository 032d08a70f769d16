# Sourced by scripts/demo, scripts/test and scripts/bench: everything a fresh machine needs,
# done once.
#  1. a venv (.venv, or $FERRODIST_VENV) with torch and the test tools, created on first use and
#     reused after (torch is never reinstalled while the venv has the pinned version);
#  2. the Rust extension (maturin, cargo profile `extension`, placed in python/ferrodist/) and
#     the ferrodist-store server (cargo, profile `release`, in target/release/). The two
#     profiles keep the builds from invalidating each other, so with nothing changed both are
#     no-ops (about 1.5 s in all);
#  3. PYTHONPATH and PATH pointing at this checkout, so several checkouts can share one venv.
#  4. before all that, system packages from Debian where missing: `protoc` (protobuf-compiler)
#     and its well-known .proto files (libprotobuf-dev), which the etcd-client crate's build
#     script runs, and `etcd` (etcd-server), which the
#     EtcdStore tests start as 3-member clusters on free loopback ports.
# Nothing is installed into the venv: `pip install .` does that (README, Install).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

missing_debs=()
command -v protoc >/dev/null 2>&1 || missing_debs+=(protobuf-compiler)
# protoc's well-known types (google/protobuf/descriptor.proto, ...) come with libprotobuf-dev,
# only a recommendation of protobuf-compiler, so --no-install-recommends leaves them out.
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing_debs+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || missing_debs+=(etcd-server)
if [ ${#missing_debs[@]} -gt 0 ]; then
  echo "== installing ${missing_debs[*]} (apt-get)"
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "${missing_debs[@]}"
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
export PATH=$VENV/bin:$REPO/target/release:$PATH
echo "== building ferrodist (maturin: the extension; cargo: ferrodist-store)"
(cd "$REPO" && maturin develop --skip-install -q 2>&1 | grep -v "^📦\|^🔗\|^🐍\|^✏️\|^🛠\|^🍹\|^📡\|build-backend" || true)
test -f "$REPO"/python/ferrodist/_native*.so || { echo "maturin build failed" >&2; exit 1; }
(cd "$REPO" && cargo build --release -q --bin ferrodist-store)
export PYTHONPATH=$REPO/python${PYTHONPATH:+:$PYTHONPATH}
