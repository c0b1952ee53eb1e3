#!/usr/bin/env bash
# Mixed interactive + batch, open loop: interactive chats (x-sluice-tier: interactive, 4 req/s,
# lognormal prompts around 48 tokens, 32-token answers, goodput objectives TTFT 1 s / TPOT 100 ms)
# alongside batch completions (6 req/s, 96-160-token prompts, 64 tokens, TTFT 60 s / TPOT 1 s),
# 60 measured seconds after 5 s of warm-up.
# Usage: bench/scenarios/mixed.sh [DURATION_S]
source "$(dirname "$0")/lib.sh"
DUR=${1:-60}
echo "== mixed interactive + batch; $(machine)"
start_sluice "$SCEN/stories15M.json"
bench --duration "$DUR" --warmup 5 --ignore-eos --timeout 300 \
  --class "interactive,rate=4,tier=interactive,endpoint=chat,prompt=lognormal:48:0.4,output=fixed:32,ttft_slo=1000,tpot_slo=100" \
  --class "batch,rate=6,tier=batch,endpoint=completions,prompt=uniform:96:160,output=fixed:64,ttft_slo=60000,tpot_slo=1000" \
  --label mixed --summary "$OUT/summary.tsv" --json "$OUT/mixed.json" --csv "$OUT/mixed.csv"
stop_sluice
echo
table "$OUT/summary.tsv" class sent ok rejected req/s out_tok/s goodput/s ttft_p50 ttft_p99 \
  tpot_p50 tpot_p99 e2el_p99
