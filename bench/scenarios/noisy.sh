#!/usr/bin/env bash
# Noisy neighbour: tenant "quiet" sends interactive chats at 2 req/s; first alone (the baseline),
# then while tenant "noisy" floods batch completions at 2x the capacity measured by flood.sh's
# rule (CAPACITY=R skips the measurement). Both are API-key tenants of noisy.json.
# What it shows depends on admission control and per-tenant limits (a later issue): today a
# tenant's flood is queued like anyone's requests, and the quiet tenant's latency follows.
# Usage: bench/scenarios/noisy.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-30}
QUIET=sk-quiet-scenario-0001
NOISY=sk-noisy-scenario-0001
QUIET_CLASS="quiet,rate=2,tenant=quiet,key=$QUIET,endpoint=chat,prompt=lognormal:48:0.4,output=32,ttft_slo=1000,tpot_slo=100"
echo "== noisy neighbour; $(machine)"
start_sluice "$SCEN/noisy.json"
if [ -z "${CAPACITY:-}" ]; then
  bench --concurrency 32 --duration 15 --warmup 3 --prompt 128 --output 64 --ignore-eos \
    --class "capacity,key=$NOISY" --label capacity --summary "$OUT/capacity.tsv" >/dev/null
  CAPACITY=$(awk -F'\t' 'NR == 2 { print $7 }' "$OUT/capacity.tsv")
fi
FLOOD=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 2 * c }')
echo "capacity ${CAPACITY} req/s; noisy floods at ${FLOOD} req/s"
bench --duration "$DUR" --warmup 3 --ignore-eos --class "$QUIET_CLASS" \
  --label alone --summary "$OUT/summary.tsv" --json "$OUT/alone.json" >/dev/null
bench --duration "$DUR" --ignore-eos --timeout 600 --class "$QUIET_CLASS" \
  --class "noisy,rate=$FLOOD,tenant=noisy,key=$NOISY,prompt=128,output=64" \
  --label "with-noisy" --summary "$OUT/summary.tsv" --json "$OUT/noisy.json" \
  --csv "$OUT/noisy.csv"
stop_sluice
echo
table "$OUT/summary.tsv" label class sent ok rejected req/s goodput/s ttft_p50 ttft_p99 tpot_p99 \
  e2el_p99
