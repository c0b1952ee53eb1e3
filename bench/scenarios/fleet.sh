#!/usr/bin/env bash
# The fleet end to end (issue 28): three sluice replicas behind nginx (round robin) on loopback,
# once sharing one redis-server and once without it (each replica's own budgets, as before the
# fleet). Prints, for a tenant with rpm 120 sent three times its budget: admitted against what one
# GCRA bucket allows; the client latency of admitted requests under the budget with and without
# Redis (what the admission's round trip adds to TTFT); and, with wrk, the decisions a second that
# the fleet makes for one tenant and for 1,000, with what they cost Redis (µs per EVALSHA, its
# CPU), projected to one Redis core.
#
# Usage: bench/scenarios/fleet.sh   env: SECONDS_EACH=20 (the budget run's length)
set -euo pipefail
cd "$(dirname "$0")/../.."
SLUICE=${SLUICE:-build/sluice}
[ -x "$SLUICE" ] || { echo "fleet: $SLUICE not found; build first" >&2; exit 1; }
exec python3 tests/fleet/replicas.py "$SLUICE" bench --seconds "${SECONDS_EACH:-20}"
