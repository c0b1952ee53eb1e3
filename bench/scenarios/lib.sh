# Shared by the scenario scripts (sourced): find the build, start and stop sluice, print tables.
# Environment: BUILD (default: build/ at the repository root), OUT (where logs, JSON and CSV
# go; default: a new folder under /tmp), SLUICE_FLAGS (extra flags for sluice), SCEN (the folder
# of the configurations; default: this one).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build}
SLUICE=$BUILD/sluice
BENCH=$BUILD/bench/sluice-bench
SCEN=${SCEN:-$ROOT/bench/scenarios}
OUT=${OUT:-$(mktemp -d /tmp/sluice-scenario-XXXXXX)}
mkdir -p "$OUT"
for b in "$SLUICE" "$BENCH"; do
  if [ ! -x "$b" ]; then
    echo "scenario: $b is missing: build first (scripts/setup.sh, or BUILD=your-build-dir)" >&2
    exit 1
  fi
done

SLUICE_PID=
URL=

# start_sluice CONFIG: starts sluice on a free loopback port and waits until it listens. Returns 1
# (the script's end under set -e) when sluice exits or does not listen, with its log on stderr.
start_sluice() {
  local log=$OUT/sluice.log
  # shellcheck disable=SC2086
  "$SLUICE" --config "$1" --listen 127.0.0.1:0 ${SLUICE_FLAGS:-} 2>"$log" &
  SLUICE_PID=$!
  local port=
  for _ in $(seq 600); do
    port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$log" | head -1)
    [ -n "$port" ] && break
    if ! kill -0 "$SLUICE_PID" 2>/dev/null; then
      echo "scenario: sluice exited:" >&2
      cat "$log" >&2
      wait "$SLUICE_PID" 2>/dev/null || true
      SLUICE_PID=
      return 1
    fi
    sleep 0.2
  done
  if [ -z "$port" ]; then
    echo "scenario: sluice did not start listening within 120 s" >&2
    stop_sluice
    return 1
  fi
  URL=http://127.0.0.1:$port
  echo "sluice: $(grep -m1 'model .*: dim' "$log" | sed 's/^[^ ]* [a-z]* //')"
}

stop_sluice() {
  if [ -n "$SLUICE_PID" ] && kill -0 "$SLUICE_PID" 2>/dev/null; then
    kill -TERM "$SLUICE_PID"
    wait "$SLUICE_PID" || true
  fi
  SLUICE_PID=
}
trap stop_sluice EXIT INT TERM

# bench ARGS...: runs sluice-bench against the server, keeping its table in $OUT/bench.txt.
bench() {
  "$BENCH" --url "$URL" --no-progress "$@" | tee -a "$OUT/bench.txt"
}

# measure_capacity DURATION_S CLASS [USERS]: sets CAPACITY to the req/s a closed loop of USERS
# (32) users gets from the server sending 128-token prompts for 64 tokens each as class CLASS
# (a sluice-bench --class spec), over DURATION_S after 3 s of warm-up; its summary goes to
# $OUT/capacity.tsv. Does nothing when CAPACITY is set already (CAPACITY=R skips it).
measure_capacity() {
  if [ -z "${CAPACITY:-}" ]; then
    bench --concurrency "${3:-32}" --duration "$1" --warmup 3 --prompt 128 --output 64 \
      --ignore-eos --class "$2" --label capacity --summary "$OUT/capacity.tsv" >/dev/null
    CAPACITY=$(awk -F'\t' 'NR == 2 { print $7 }' "$OUT/capacity.tsv")
  fi
}

machine() {
  local cpu
  cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) vCPU ($cpu); load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

# table FILE [COLUMNS...]: prints a --summary file as an aligned table (all columns by default).
table() {
  local file=$1
  shift
  awk -F'\t' -v cols="$*" '
    BEGIN { n = split(cols, want, " ") }
    NR == 1 { for (i = 1; i <= NF; i++) idx[$i] = i; if (!n) for (i = 1; i <= NF; i++) want[++n] = $i }
    { row[NR] = $0 }
    END {
      for (r = 1; r <= NR; r++) {
        split(row[r], f, "\t")
        for (j = 1; j <= n; j++) {
          v = (r == 1) ? want[j] : f[idx[want[j]]]
          cell[r, j] = v
          if (length(v) > w[j]) w[j] = length(v)
        }
      }
      for (r = 1; r <= NR; r++) {
        line = ""
        for (j = 1; j <= n; j++)
          line = line sprintf(j <= 2 ? "%-*s  " : "%*s  ", w[j], cell[r, j])
        sub(/ +$/, "", line)
        print line
      }
    }' "$file"
}
