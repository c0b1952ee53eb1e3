#!/usr/bin/env bash
# Sets up, builds, and starts sluice (default: the synthetic model on 127.0.0.1:8080).
# Extra arguments go to sluice, e.g. scripts/run.sh --listen 0.0.0.0:9000.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/sluice "$@"
