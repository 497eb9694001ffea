#!/usr/bin/env bash
# A local Mooncake master with its embedded HTTP metadata server, on loopback only.
#   tools/hicache/mooncake_master.sh [RPC_PORT=50051] [HTTP_PORT=8080]
# Then: --hicache-storage-backend mooncake --hicache-storage-backend-extra-config
#   '{"master_server_address": "127.0.0.1:RPC_PORT",
#     "metadata_server": "http://127.0.0.1:HTTP_PORT/metadata"}'
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${ENGINE_VENV:-.venv}/bin/mooncake_master
exec "$BIN" --rpc_port="${1:-50051}" --enable_http_metadata_server=true \
  --http_metadata_server_host=127.0.0.1 --http_metadata_server_port="${2:-8080}"
