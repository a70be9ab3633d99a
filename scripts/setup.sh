#!/usr/bin/env bash
# Installs what fencelock's demo and tests need and is missing on this machine
# (Debian/Ubuntu). Safe to run again: it only installs what is absent.
set -euo pipefail

need_pkgs=()
command -v redis-server   >/dev/null 2>&1 || need_pkgs+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || need_pkgs+=(redis-sentinel)
command -v redis-cli      >/dev/null 2>&1 || need_pkgs+=(redis-tools)
# The etcd tests (feature `etcd`) start etcd members themselves and talk to
# them with etcdctl; building the etcd client compiles protobufs with protoc,
# which needs the well-known .proto files of libprotobuf-dev.
command -v etcd           >/dev/null 2>&1 || need_pkgs+=(etcd-server)
command -v etcdctl        >/dev/null 2>&1 || need_pkgs+=(etcd-client)
command -v protoc         >/dev/null 2>&1 || need_pkgs+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_pkgs+=(libprotobuf-dev)
# The README's read-modify-write snippet, which the tests run as written,
# reads JSON with jq.
command -v jq             >/dev/null 2>&1 || need_pkgs+=(jq)
# scripts/client-cost, which the tests run on small counts, counts
# instructions with valgrind's callgrind.
command -v valgrind       >/dev/null 2>&1 || need_pkgs+=(valgrind)
# The Python package (crates/fencelock-py) is built and tested in a
# virtualenv (below). Debian's python3 has the venv module but creates a
# virtualenv only with python3-venv installed (it brings ensurepip).
if ! command -v python3 >/dev/null 2>&1; then
  need_pkgs+=(python3 python3-venv)
elif ! { python3 -m venv --help && python3 -c 'import ensurepip'; } >/dev/null 2>&1; then
  need_pkgs+=(python3-venv)
fi
# The Postgres tests (feature `postgres`) run initdb and postgres themselves.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
  || command -v initdb    >/dev/null 2>&1 || need_pkgs+=(postgresql)

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}" >&2
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# The Debian packages also install services; fencelock never uses them (tests
# start their own servers on free ports), and a default one on 6379 is not
# ours to rely on.

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install cargo-nextest --locked
fi

# The Python package's virtualenv, ${FENCELOCK_VENV:-.venv}: maturin, pytest
# and the libraries the tests and the bench use, pinned in
# crates/fencelock-py/requirements-dev.txt. Everything goes into the venv (a
# system Python may refuse pip installs, PEP 668). The stamp holds the hash of
# the pins and the venv's Python version: when both are unchanged this is a
# no-op.
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${FENCELOCK_VENV:-$repo/.venv}
reqs=$repo/crates/fencelock-py/requirements-dev.txt
stamp=$venv/.fencelock-requirements
if ! "$venv/bin/python" -c '' >/dev/null 2>&1; then
  echo "setup: creating the virtualenv $venv" >&2
  # A broken virtualenv (its Python gone) is made anew; any other directory
  # is only added to, never cleared.
  clear=()
  [ ! -f "$venv/pyvenv.cfg" ] || clear=(--clear)
  python3 -m venv "${clear[@]}" "$venv"
fi
want=$({ cat "$reqs"; "$venv/bin/python" -VV; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing crates/fencelock-py/requirements-dev.txt into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs"
  echo "$want" >"$stamp"
fi
