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
