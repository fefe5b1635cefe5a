#!/usr/bin/env bash
# faults/run.sh MODULE [DOC]: the full fault campaign (faults/campaign.py)
# against the module at MODULE, on its own Redis, nginx and origin; with
# DOC (make faults: docs/faults.md), the table there is regenerated.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
FAULTS_MODULE=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
export FAULTS_MODULE
export TEST_NGINX_BINARY=${TEST_NGINX_BINARY:-/usr/sbin/nginx}

args=(--out "${FAULTS_OUT:-$top/build/faults}")
if [ -n "${2:-}" ]; then
    args+=(--doc "$2")
fi
exec python3 "$top/faults/campaign.py" "${args[@]}"
