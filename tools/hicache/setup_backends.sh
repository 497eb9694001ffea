#!/usr/bin/env bash
# Install the client libraries of the storage backends that run on one machine without a GPU
# (Mooncake over TCP, NIXL's POSIX plugin) into the engine's virtual environment.
#   tools/hicache/setup_backends.sh            # both
#   tools/hicache/setup_backends.sh mooncake   # one
# Mooncake's native library links libibverbs.so.1 even for TCP; as root this installs it too.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${ENGINE_VENV:-.venv}/bin/python
want=${1:-all}
if [[ $want == all || $want == mooncake ]]; then
  "$PY" -m pip install -q mooncake-transfer-engine-non-cuda
  if ! ldconfig -p | grep -q libibverbs.so.1; then
    if [[ $(id -u) == 0 ]]; then apt-get install -y -q libibverbs1; else
      echo "Mooncake needs libibverbs.so.1: apt-get install libibverbs1" >&2; fi
  fi
fi
if [[ $want == all || $want == nixl ]]; then
  # nixl-cu12 declares torch as a dependency: keep the engine's torch
  "$PY" -m pip install -q --no-deps nixl-cu12
  "$PY" -m pip install -q numpy
fi
