#!/usr/bin/env bash
# Automatic prefix caching (issue 31). USERS (16) users of one tenant chat in a closed loop with
# synthetic:stories15M-4k (stories15M's width, context 4096; admission off, so nothing is
# refused): each request a system prompt of PREFIX (1000) tokens that every request shares, a
# question of QUESTION (50) tokens of its own, and 16 to 32 output tokens (ignore_eos). Four
# arms, each on a fresh server for DURATION_S (30) measured seconds after WARMUP (5) s:
#   shared-on    the shared system prompt, "prefix_cache": {"enabled": true, "scope": "tenant"}
#   shared-off   the same with "enabled": false
#   random-on    the same shape with nothing shared (sluice-bench --unique-prefix: each request
#                draws its own system prompt of the same length), cache enabled
#   random-off   the same, cache disabled
# ROUNDS (2) times, on before off in odd rounds and off before on in even ones. Prints a table
# (TTFT p50/p99, req/s, output tok/s, the cached share of prompt tokens from the responses'
# usage.prompt_tokens_details.cached_tokens for measured requests, and sluice:prefix_cache_hits_
# total / sluice:prefix_cache_queries_total from /metrics over the server's life, probes and
# warm-up included), the ratios per round, then as its last line one JSON object:
#   {"shared_ttft_p50_on_over_off", "shared_ttft_p99_on_over_off", "shared_cached_share",
#    "shared_metrics_hit_ratio", "random_req_s_on_over_off", "random_out_tok_s_on_over_off",
#    "cache_config", "rounds": [...]}   (the top-level figures pool the rounds: ratios of means)
# Targets (issue 31): with >= 90 % of the prompt cached, shared TTFT p50 on/off <= 0.2; random
# req/s on/off >= 0.97 (the bookkeeping costs nothing measurable).
# A build whose configuration does not know "prefix_cache" runs every arm without it (the two
# arms of a pair are then the same server) and says so.
# Usage: bench/scenarios/prefix.sh [DURATION_S]   env: ROUNDS USERS PREFIX QUESTION WARMUP
source "$(dirname "$0")/lib.sh"
DUR=${1:-30}
ROUNDS=${ROUNDS:-2}
USERS=${USERS:-16}
PREFIX=${PREFIX:-1000}
QUESTION=${QUESTION:-50}
WARMUP=${WARMUP:-5}
KEY=sk-prefix-scenario-0001
METRICS=$OUT/metrics.tsv

echo "== prefix caching: $USERS users, ${PREFIX}-token shared system prompt + ${QUESTION}-token" \
  "questions, 16-32 out; ${DUR} s an arm, $ROUNDS rounds; $(machine)"
for mode in on off; do
  enabled=true
  [ "$mode" = off ] && enabled=false
  sed "s/\"enabled\": true/\"enabled\": $enabled/" "$SCEN/prefix.json" >"$OUT/$mode.json"
done
CACHE_CONFIG=yes
if ! "$SLUICE" --check-config "$OUT/on.json" --listen 127.0.0.1:0 >"$OUT/check.txt" 2>&1; then
  if grep -q prefix_cache "$OUT/check.txt"; then
    CACHE_CONFIG=no
    echo "NOTE: this sluice does not know the config key prefix_cache: every arm runs without it"
    for mode in on off; do
      python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c.pop("prefix_cache"); json.dump(c, open(sys.argv[1], "w"), indent=1)' \
        "$OUT/$mode.json"
    done
  else
    cat "$OUT/check.txt" >&2
    exit 1
  fi
fi
printf 'label\thits\tqueries\n' >"$METRICS"

# metric NAME: the sum of NAME's samples (any labels) in $OUT/metrics.txt, or "-".
metric() {
  awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $NF; found = 1 }
    END { if (found) printf "%.0f", s; else print "-" }' "$OUT/metrics.txt"
}

arm() { # ROUND SHARING(shared|random) CACHE(on|off)
  local label=$2-$3-r$1 unique=()
  [ "$2" = random ] && unique=(--unique-prefix)
  start_sluice "$OUT/$3.json" >/dev/null
  bench --concurrency "$USERS" --duration "$DUR" --warmup "$WARMUP" --api-key "$KEY" \
    --endpoint /v1/chat/completions --shared-prefix-tokens "$PREFIX" --prompt "$QUESTION" \
    "${unique[@]}" --output uniform:16:32 --ignore-eos \
    --label "$label" --summary "$OUT/summary.tsv" --json "$OUT/$label.json" \
    --csv "$OUT/$label.csv" >/dev/null
  curl -sf "$URL/metrics" >"$OUT/metrics.txt" || : >"$OUT/metrics.txt"
  cp "$OUT/metrics.txt" "$OUT/$label.metrics"
  printf '%s\t%s\t%s\n' "$label" "$(metric sluice:prefix_cache_hits_total)" \
    "$(metric sluice:prefix_cache_queries_total)" >>"$METRICS"
  stop_sluice
  cp "$OUT/sluice.log" "$OUT/$label.log"
  echo "$label: done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

for r in $(seq "$ROUNDS"); do
  order="on off"
  [ $((r % 2)) -eq 0 ] && order="off on"
  for sharing in shared random; do
    for cache in $order; do
      arm "$r" "$sharing" "$cache"
    done
  done
done

echo
python3 - "$OUT/summary.tsv" "$METRICS" "$ROUNDS" "$CACHE_CONFIG" <<'PY'
import csv, json, sys

summary, metrics, rounds, cache_config = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = {r["label"]: r for r in csv.DictReader(open(summary), delimiter="\t")}
hits = {r["label"]: r for r in csv.DictReader(open(metrics), delimiter="\t")}


def fig(label, key):
    return float(rows[label][key])


def ratio(a, b):
    return round(a / b, 3) if b else None


def mean(xs):
    return sum(xs) / len(xs)


print("%-16s %5s %8s %10s %9s %9s %10s %7s %9s" % (
    "arm", "ok", "req/s", "out_tok/s", "ttft_p50", "ttft_p99", "in_tok/req", "cached",
    "hit_ratio"))
for label, x in rows.items():
    ok, intok, cached = int(x["ok"]), float(x["in_tok"]), float(x["cached_tok"])
    h = hits.get(label, {})
    q = h.get("queries", "-")
    print("%-16s %5d %8s %10s %9s %9s %10.0f %6.1f%% %9s" % (
        label, ok, x["req/s"], x["out_tok/s"], x["ttft_p50"], x["ttft_p99"],
        intok / ok if ok else 0, 100 * cached / intok if intok else 0,
        "%.1f%%" % (100 * float(h["hits"]) / float(q)) if q not in ("-", "0") else "-"))
print("(cached: usage.prompt_tokens_details.cached_tokens of measured requests; hit_ratio: "
      "/metrics prefix_cache_hits_total / queries_total over the server's life)")
print()

per_round = []
pool = {k: [] for k in ("on_p50", "off_p50", "on_p99", "off_p99", "on_rps", "off_rps",
                        "on_tok", "off_tok", "in", "cached", "hits", "queries")}
for r in range(1, rounds + 1):
    son, soff, ron, roff = (f"{s}-{c}-r{r}" for s in ("shared", "random") for c in ("on", "off"))
    p = {
        "round": r,
        "shared_ttft_p50_on_over_off": ratio(fig(son, "ttft_p50"), fig(soff, "ttft_p50")),
        "shared_ttft_p99_on_over_off": ratio(fig(son, "ttft_p99"), fig(soff, "ttft_p99")),
        "shared_req_s_on_over_off": ratio(fig(son, "req/s"), fig(soff, "req/s")),
        "random_req_s_on_over_off": ratio(fig(ron, "req/s"), fig(roff, "req/s")),
        "random_out_tok_s_on_over_off": ratio(fig(ron, "out_tok/s"), fig(roff, "out_tok/s")),
    }
    per_round.append(p)
    print("round %d: shared TTFT p50 on/off %s (target <= 0.2), p99 %s, req/s %s; random req/s "
          "on/off %s, out tok/s %s (target >= 0.97)" % (
              r, p["shared_ttft_p50_on_over_off"], p["shared_ttft_p99_on_over_off"],
              p["shared_req_s_on_over_off"], p["random_req_s_on_over_off"],
              p["random_out_tok_s_on_over_off"]))
    pool["on_p50"].append(fig(son, "ttft_p50"))
    pool["off_p50"].append(fig(soff, "ttft_p50"))
    pool["on_p99"].append(fig(son, "ttft_p99"))
    pool["off_p99"].append(fig(soff, "ttft_p99"))
    pool["on_rps"].append(fig(ron, "req/s"))
    pool["off_rps"].append(fig(roff, "req/s"))
    pool["on_tok"].append(fig(ron, "out_tok/s"))
    pool["off_tok"].append(fig(roff, "out_tok/s"))
    pool["in"].append(fig(son, "in_tok"))
    pool["cached"].append(fig(son, "cached_tok"))
    h = hits.get(son, {})
    if h.get("queries", "-") not in ("-", "0"):
        pool["hits"].append(float(h["hits"]))
        pool["queries"].append(float(h["queries"]))
out = {
    "shared_ttft_p50_on_over_off": ratio(mean(pool["on_p50"]), mean(pool["off_p50"])),
    "shared_ttft_p99_on_over_off": ratio(mean(pool["on_p99"]), mean(pool["off_p99"])),
    "shared_cached_share": ratio(sum(pool["cached"]), sum(pool["in"])),
    "shared_metrics_hit_ratio": ratio(sum(pool["hits"]), sum(pool["queries"]))
    if pool["queries"] else None,
    "random_req_s_on_over_off": ratio(mean(pool["on_rps"]), mean(pool["off_rps"])),
    "random_out_tok_s_on_over_off": ratio(mean(pool["on_tok"]), mean(pool["off_tok"])),
    "cache_config": cache_config == "yes",
    "rounds": per_round,
}
print(json.dumps(out))
PY
