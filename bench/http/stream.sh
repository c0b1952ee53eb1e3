#!/usr/bin/env bash
# Gateway CPU per streamed token: sluice-bench's closed loop of USERS users streaming OUTPUT-token
# completions (ignore_eos, so every one is OUTPUT tokens long) from the embedded synthetic model,
# and the CPU time of sluice's I/O thread over the run divided by the tokens streamed. With
# io_threads 1 the I/O thread is the last thread sluice creates (engines start first), so its
# CPU is read from /proc/PID/task/TID/{schedstat,stat} of the highest TID: no help from the binary
# is needed, and builds (a baseline and this tree) are measured the same way, alternated REPS times.
#
# Usage: bench/http/stream.sh [SLUICE ...]   (default build/sluice; several binaries alternate)
# env: USERS=64 OUTPUT=256 PROMPT=32 REQUESTS=256 REPS=3 MODEL=synthetic
# Prints, per run: binary, seconds, tokens, the I/O thread's CPU per token (schedstat's exact time
# on a CPU, then user and system apart from stat's 10 ms ticks, coarse: most of the system part is
# the write of each token's event and, on loopback, the client's receive path, which the kernel
# runs in the writer's context), and the whole process's CPU per token (the engine's included).
# The embedded model steps so fast that the I/O thread sometimes takes several steps' tokens in
# one write, and runs split into fast and slow ones; MODEL=synthetic:stories15M USERS=32
# OUTPUT=128 steps slower and writes once per token per step, run after run.
set -euo pipefail
cd "$(dirname "$0")/../.."

USERS=${USERS:-64}
OUTPUT=${OUTPUT:-256}
PROMPT=${PROMPT:-32}
REQUESTS=${REQUESTS:-256}
REPS=${REPS:-3}
MODEL=${MODEL:-synthetic}
BENCH=${BENCH:-build/bench/sluice-bench}
bins=("$@")
((${#bins[@]})) || bins=(build/sluice)
[ -x "$BENCH" ] || { echo "bench/http/stream: $BENCH not found; build first" >&2; exit 1; }

tmp=$(mktemp -d /tmp/sluice-bench-stream.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

ticks() { # /proc stat file -> "utime stime" (clock ticks: 10 ms apart)
  awk '{print $14, $15}' "$1"
}

oncpu() { # /proc schedstat file -> nanoseconds on a CPU (exact, user and system together)
  awk '{print $1}' "$1"
}

hz=$(getconf CLK_TCK)
printf '%-36s %7s %7s %12s %9s %9s %14s\n' binary seconds tokens "io us/token" "io user" \
  "io sys" "process us/tok"
for ((rep = 0; rep < REPS; rep++)); do
  for bin in "${bins[@]}"; do
    port=$(free_port)
    "$bin" --listen "127.0.0.1:$port" --model "$MODEL" 2>"$tmp/sluice.log" &
    pid=$!
    for _ in $(seq 100); do
      curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
      sleep 0.1
    done
    io_tid=$(ls "/proc/$pid/task" | sort -n | tail -1)
    read -r u0 s0 < <(ticks "/proc/$pid/task/$io_tid/stat")
    ns0=$(oncpu "/proc/$pid/task/$io_tid/schedstat")
    read -r pu0 ps0 < <(ticks "/proc/$pid/stat")
    t0=$(date +%s.%N)
    "$BENCH" --url "http://127.0.0.1:$port" --concurrency "$USERS" --num-requests "$REQUESTS" \
      --prompt "fixed:$PROMPT" --output "fixed:$OUTPUT" --ignore-eos --no-calibrate \
      >"$tmp/bench.out" 2>&1 || { cat "$tmp/bench.out" >&2; exit 1; }
    t1=$(date +%s.%N)
    read -r u1 s1 < <(ticks "/proc/$pid/task/$io_tid/stat")
    ns1=$(oncpu "/proc/$pid/task/$io_tid/schedstat")
    read -r pu1 ps1 < <(ticks "/proc/$pid/stat")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    tokens=$((REQUESTS * OUTPUT))
    awk -v b="$bin" -v s="$(echo "$t1 - $t0" | bc)" -v n="$tokens" -v u=$((u1 - u0)) \
      -v y=$((s1 - s0)) -v p=$((pu1 + ps1 - pu0 - ps0)) -v hz="$hz" -v ns=$((ns1 - ns0)) \
      'BEGIN {k = 1e6 / hz / n; printf "%-36s %7.1f %7d %12.2f %9.2f %9.2f %14.2f\n", b, s, n,
              ns / 1e3 / n, u * k, y * k, p * k}'
  done
done
