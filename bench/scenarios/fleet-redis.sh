#!/usr/bin/env bash
# What the fleet's budget script costs one Redis (issue 28): starts a redis-server on a free
# loopback port (no persistence) and runs fleet-bench against it, one tenant hammered and then
# 10,000 tenants, one call in flight per connection (the round trip an admission waits for) and
# then pipelined (what Redis sustains when many replicas send at once).
#
# Usage: bench/scenarios/fleet-redis.sh   env: CLIENTS=4 SECONDS=5
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCH=${BENCH:-build/bench/fleet-bench}
CLIENTS=${CLIENTS:-4}
SECS=${SECONDS_EACH:-5}
[ -x "$BENCH" ] || { echo "fleet-redis: $BENCH not found; build first" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "fleet-redis: redis-server not installed" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning \
  >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$port" info server | grep -E '^redis_version' | tr -d '\r'
for tenants in 1 10000; do
  for pipeline in 1 16; do
    "$BENCH" --port "$port" --clients "$CLIENTS" --tenants "$tenants" --seconds "$SECS" \
      --pipeline "$pipeline"
  done
done
redis-cli -p "$port" info memory | grep -E '^used_memory_human' | tr -d '\r'
redis-cli -p "$port" dbsize | sed 's/^/keys: /'
