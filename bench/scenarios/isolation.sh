#!/usr/bin/env bash
# Tier isolation at the step (issue 30): interactive chats at 30 % of capacity alone (the
# unloaded baseline), then under a batch flood at 3x capacity with the interactive tier's
# isolation_ms as flood.json gives it (the default), then the same flood with isolation_ms 0
# (steps full of batch prompt chunks, as before). Capacity is measured first as flood.sh does
# (CAPACITY=R skips it). DURATION_S (15) each.
# Prints a table, then as its last line one JSON object:
#   {"unloaded_p99_ttft_ms", "isolated_p99_ttft_ms", "off_p99_ttft_ms", "isolated_over_unloaded",
#    "batch_goodput_isolated", "batch_goodput_off", "batch_goodput_ratio"}
# Usage: bench/scenarios/isolation.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-15}
echo "== tier isolation: interactive alone, then with a batch flood, isolation on and off; $(machine)"
python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["tiers"]["interactive"]["isolation_ms"] = 0
json.dump(c, open(sys.argv[2], "w"), indent=1)' "$SCEN/flood.json" "$OUT/flood-noiso.json"
start_sluice "$SCEN/flood.json"
measure_capacity 10 "capacity,tier=batch"
BATCH=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 3 * c }')
INTER=$(awk -v c="$CAPACITY" 'BEGIN { printf "%.2f", 0.3 * c }')
echo "capacity ${CAPACITY} req/s: batch at ${BATCH} req/s, interactive at ${INTER} req/s"
ICLASS="interactive,rate=$INTER,tier=interactive,endpoint=chat,prompt=lognormal:48:0.4,output=32,ttft_slo=1000,tpot_slo=100"
BCLASS="batch,rate=$BATCH,tier=batch,prompt=128,output=64,ttft_slo=10000,tpot_slo=1000"
bench --duration "$DUR" --warmup 3 --ignore-eos --class "$ICLASS" --label unloaded \
  --summary "$OUT/summary.tsv" >/dev/null
run() { # label
  bench --duration "$DUR" --ignore-eos --timeout 600 --class "$BCLASS" --class "$ICLASS" \
    --label "$1" --summary "$OUT/summary.tsv" --json "$OUT/$1.json" >/dev/null
  echo "$1: done; $(cut -d' ' -f1-3 /proc/loadavg) load average"
}
run isolated
stop_sluice
cp "$OUT/sluice.log" "$OUT/sluice-isolated.log"
start_sluice "$OUT/flood-noiso.json"
run off
stop_sluice
echo
table "$OUT/summary.tsv" label class sent ok rejected req/s goodput/s ttft_p50 ttft_p99 tpot_p99 \
  e2el_p99
echo
awk -F'\t' '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  $col["class"] == "interactive" { p99[$1] = $col["ttft_p99"] }
  $col["class"] == "batch" { good[$1] = $col["goodput/s"] }
  END {
    printf "{\"unloaded_p99_ttft_ms\": %s, \"isolated_p99_ttft_ms\": %s, \"off_p99_ttft_ms\": %s, " \
      "\"isolated_over_unloaded\": %.2f, \"batch_goodput_isolated\": %s, " \
      "\"batch_goodput_off\": %s, \"batch_goodput_ratio\": %.3f}\n", p99["unloaded"],
      p99["isolated"], p99["off"], p99["isolated"] / p99["unloaded"], good["isolated"],
      good["off"], good["isolated"] / good["off"]
  }' "$OUT/summary.tsv"
