#!/usr/bin/env bash
# Concurrency sweep: closed loop at 1, 4, 16 and 64 users against sluice (synthetic:stories15M on
# CPU), 64-token prompts and 64-token outputs, 20 measured seconds per level after 3 s of warm-up.
# Usage: bench/scenarios/sweep.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-20}
echo "== concurrency sweep; $(machine)"
start_sluice "$SCEN/stories15M.json"
for c in 1 4 16 64; do
  bench --concurrency "$c" --duration "$DUR" --warmup 3 --prompt 64 --output 64 --ignore-eos \
    --label "c=$c" --summary "$OUT/summary.tsv" --json "$OUT/sweep-c$c.json" >/dev/null
done
stop_sluice
echo
table "$OUT/summary.tsv" label ok req/s out_tok/s ttft_p50 ttft_p99 tpot_p50 tpot_p99 itl_p99 \
  e2el_p50 e2el_p99
echo "(latencies in ms; JSON per level in $OUT)"
