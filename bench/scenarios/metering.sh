#!/usr/bin/env bash
# What metering costs a request (issue 29): the same wrk load (POST /v1/completions of one token
# on synthetic:tiny, so the gateway's own work dominates) against sluice twice, alternating:
# usage in memory only, and with a state_dir whose journal gets one line per request (one
# write(2) per I/O-thread flush, fdatasync at most once a second). Prints requests/s and wrk's
# latency percentiles for each, and checks that the journal holds one record per request.
#
# Usage: bench/scenarios/metering.sh [SECONDS]   env: ROUNDS=2 CONNS=16
source "$(dirname "$0")/lib.sh"
SECS=${1:-10}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-16}
command -v wrk >/dev/null || { echo "metering: wrk is not installed" >&2; exit 1; }
state=$OUT/state
mkdir -p "$state"
lua=$OUT/post.lua
cat >"$lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"prompt":"Once upon a time","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
LUA
for mode in memory journal; do
  extra=""
  [ "$mode" = journal ] && extra=",\"state_dir\":\"$state\""
  printf '{"model":"synthetic:tiny","threads":1,"price":{"input_per_mtok":0.15,"output_per_mtok":0.6}%s}\n' \
    "$extra" >"$OUT/$mode.json"
done
echo "wrk -t2 -c$CONNS -d${SECS}s, POST /v1/completions max_tokens 1, synthetic:tiny, $ROUNDS rounds"
printf '%-10s %6s %12s %10s %10s %10s\n' usage round requests/s p50 p99 journal
for r in $(seq "$ROUNDS"); do
  for mode in memory journal; do
    rm -f "$state/usage.jsonl"
    start_sluice "$OUT/$mode.json"
    out=$(wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s "$lua" "$URL/v1/completions")
    stop_sluice
    rps=$(echo "$out" | sed -n 's/^Requests\/sec: *//p')
    p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
    p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
    total=$(echo "$out" | sed -n 's/^ *\([0-9]*\) requests in.*/\1/p')
    lines=-
    if [ "$mode" = journal ]; then
      # Compacted at the next start: count the requests on record instead of lines.
      lines=$("$SLUICE" usage export --state-dir "$state" --group-by tenant --format json |
        python3 -c 'import json,sys; print(sum(r["requests"] for r in json.load(sys.stdin)))')
      lines="$lines/$total"
    fi
    printf '%-10s %6s %12s %10s %10s %10s\n' "$mode" "$r" "$rps" "$p50" "$p99" "$lines"
  done
done
