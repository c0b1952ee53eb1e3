#!/usr/bin/env bash
# sluice against llama.cpp on the same GGUF files, side by side (issue 32). For each model and
# round, the two sides alternate (which goes first flips every round, and between the served
# user counts):
#   engine  sluice's engine-bench against llama-bench and llama-batched-bench, THREADS each:
#           decode at batch 1 (engine-bench --only-decode 1 at context 32, the middle of
#           llama-bench's tg64), decode at batch 16 (--only-decode 16 at context 64;
#           llama-batched-bench -npp 32 -ntg 64 -npl 16, whose contexts run from 32 to 96) and
#           a prefill of 512 tokens (--only-prefill; llama-bench pp512); best of REPS each
#           (llama-batched-bench run REPS times). Batch 1 is also a fraction of its bandwidth
#           floor: the machine's read bandwidth (engine-bench's mem_bw_gbs, a 1 GiB streaming
#           read, measured beside each model's pair) over the weight bytes a decode step reads
#           (every matrix but the token embedding, counted from the file as engine-bench does).
#   served  closed loops of USERS users (1 and 16), 32-token prompts, 64 output tokens,
#           ignore_eos, greedy, sluice-bench the client of both: sluice (threads THREADS,
#           max_seqs 16, admission off) and llama-server (-t THREADS -np 16 -c 16*(32+64+64)
#           --cont-batching), a fresh server for each arm on a free loopback port. Each user's
#           first request is a warm-up, then each sends REQUESTS measured ones: the users start
#           together, so an arm is 1 + REQUESTS waves whatever the machine's speed (a 16-user
#           wave of a 1.1B model takes a minute or two on 2 vCPUs, longer than any fixed window
#           short enough to run). Output tokens/s, TTFT and TPOT p50, and the tokens a request
#           got (64 when ignore_eos is honoured).
# Prints the machine and uptime before and after, then a markdown table per model with the
# ratios sluice / llama.cpp (throughput above 1 and latency below 1 favour sluice). A side that
# cannot load a file (sluice before K-quants, say) is reported as failed with its reason, and the
# run goes on with the other side.
#
# Usage: bench/scenarios/peer.sh [options] MODEL.gguf [MODEL.gguf ...]
#   --sluice DIR    sluice's build folder (default $BUILD, else build/)
#   --llama DIR     the folder of llama-bench, llama-batched-bench and llama-server
#                   (default $LLAMA_BIN)
#   --threads N     kernel threads of each side (2)
#   --rounds N      rounds (2)
#   --reps N        repetitions of each engine figure, best reported (3)
#   --requests N    measured requests of each served user, after one warm-up request (2)
#   --users LIST    served closed-loop users, comma-separated (1,16)
#   --parts LIST    engine,served (both)
#   --save          also append the report to bench/results/<date>-peer.md
# Environment as the other scenarios: OUT keeps every log, JSON and the results TSV.
set -euo pipefail

usage() {
  sed -n '/^# Usage:/,/^# Environment/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

THREADS=2 ROUNDS=2 REPS=3 REQUESTS=2 USERS=1,16 PARTS=engine,served SAVE=
LLAMA_BIN=${LLAMA_BIN:-}
MODELS=()
while [ $# -gt 0 ]; do
  case $1 in
  --sluice) BUILD=$2 && shift ;;
  --llama) LLAMA_BIN=$2 && shift ;;
  --threads) THREADS=$2 && shift ;;
  --rounds) ROUNDS=$2 && shift ;;
  --reps) REPS=$2 && shift ;;
  --requests) REQUESTS=$2 && shift ;;
  --users) USERS=$2 && shift ;;
  --parts) PARTS=$2 && shift ;;
  --save) SAVE=1 ;;
  -h | --help) usage ;;
  -*) usage ;;
  *) MODELS+=("$1") ;;
  esac
  shift
done
[ ${#MODELS[@]} -gt 0 ] || usage
for n in "$THREADS" "$ROUNDS" "$REPS" "$REQUESTS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || usage
done
[[ $USERS =~ ^[0-9]+(,[0-9]+)*$ ]] || usage
[ -n "${BUILD:-}" ] && BUILD=$(cd "$BUILD" && pwd)

# shellcheck source=bench/scenarios/lib.sh
source "$(dirname "$0")/lib.sh"
ENGINE=$BUILD/bench/engine-bench
PY=(python3 "$ROOT/bench/scenarios/peer.py")
[ -x "$ENGINE" ] || { echo "peer: $ENGINE is missing: build first" >&2 && exit 1; }
if [ -z "$LLAMA_BIN" ]; then
  echo "peer: give llama.cpp's bin folder (--llama DIR or LLAMA_BIN); bench/README.md," \
    "\"peer.sh\", says what it needs" >&2
  exit 1
fi
LLAMA_BIN=$(cd "$LLAMA_BIN" && pwd)
for b in llama-bench llama-batched-bench llama-server; do
  [ -x "$LLAMA_BIN/$b" ] || { echo "peer: $LLAMA_BIN/$b is missing" >&2 && exit 1; }
done
for f in "${MODELS[@]}"; do
  [ -r "$f" ] || { echo "peer: cannot read $f" >&2 && exit 1; }
done

IFS=, read -r -a USER_LIST <<<"$USERS"
MAX_USERS=16
for u in "${USER_LIST[@]}"; do [ "$u" -gt "$MAX_USERS" ] && MAX_USERS=$u; done
PROMPT=32 OUTPUT=64
LLAMA_CTX=$((MAX_USERS * (PROMPT + OUTPUT + 64))) # 64: room for sluice-bench's 80-word probe
RES=$OUT/results.tsv
REPORT=$OUT/peer.md
: >"$RES"

LLAMA_PID=
LLAMA_URL=
stop_llama() {
  if [ -n "$LLAMA_PID" ] && kill -0 "$LLAMA_PID" 2>/dev/null; then
    kill -TERM "$LLAMA_PID"
    wait "$LLAMA_PID" || true
  fi
  LLAMA_PID=
}
cleanup() {
  stop_sluice
  stop_llama
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_llama FILE LOG: llama-server on a free loopback port; returns 1 when it exits or does not
# listen within 300 s (it logs "listening on" once the model is loaded).
start_llama() {
  "$LLAMA_BIN/llama-server" -m "$1" -t "$THREADS" -tb "$THREADS" -np "$MAX_USERS" \
    -c "$LLAMA_CTX" --cont-batching --host 127.0.0.1 --port 0 --no-webui >"$2" 2>&1 &
  LLAMA_PID=$!
  local port=
  for _ in $(seq 1500); do
    port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$2" | head -1)
    [ -n "$port" ] && break
    if ! kill -0 "$LLAMA_PID" 2>/dev/null; then
      wait "$LLAMA_PID" 2>/dev/null || true
      LLAMA_PID=
      return 1
    fi
    sleep 0.2
  done
  if [ -z "$port" ]; then
    stop_llama
    return 1
  fi
  LLAMA_URL=http://127.0.0.1:$port
}

# record MODEL ROUND PART USERS KEY SIDE VALUE: one line of the results (peer.py render).
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RES"
}

# why FILE: the last line of a log that says what went wrong, on one line.
why() {
  { grep -iE 'error|fail|cannot|unsupported|not |missing|invalid' "$1" || tail -n 3 "$1"; } |
    tail -n 1 | sed 's/^[0-9T:.Z-]* [a-z]* //' | cut -c1-240
}

say() { echo "peer: $*" >&2; }

declare -A SLUICE_BAD=() # model -> why sluice cannot load it

# engine_sluice FILE NAME ROUND
engine_sluice() {
  local f=$1 m=$2 r=$3 p=$OUT/$2-r$3-sluice k w
  if [ -n "${SLUICE_BAD[$m]:-}" ]; then
    for k in decode_1 decode_1_floor decode_16 prefill_512; do
      record "$m" "$r" engine - "$k" sluice "FAIL: ${SLUICE_BAD[$m]}"
    done
    return
  fi
  say "round $r, $m: sluice engine-bench (decode 1, decode 16, prefill 512)"
  local runs=("d1:--only-decode 1 --ctx 32 --reps $REPS"
    "d16:--only-decode 16 --ctx 64 --reps $REPS"
    "pp:--only-prefill $REPS --prompt 512 --reps 1")
  for run in "${runs[@]}"; do
    k=${run%%:*}
    # shellcheck disable=SC2086
    if ! "$ENGINE" --model "$f" --threads "$THREADS" ${run#*:} >"$p-$k.json" 2>"$p-$k.err"; then
      w=$(why "$p-$k.err")
      say "sluice failed on $m: $w"
      SLUICE_BAD[$m]=$w
      engine_sluice "$@"
      return
    fi
  done
  record "$m" "$r" engine - decode_1 sluice "$("${PY[@]}" get "$p-d1.json" decode_tok_s.1)"
  record "$m" "$r" engine - decode_16 sluice "$("${PY[@]}" get "$p-d16.json" decode_tok_s.16)"
  record "$m" "$r" engine - prefill_512 sluice \
    "$("${PY[@]}" get "$p-pp.json" prefill_tok_s_best)"
}

# engine_llama FILE NAME ROUND
engine_llama() {
  local f=$1 m=$2 r=$3 p=$OUT/$2-r$3-llama pp tg mtype commit tgs i
  say "round $r, $m: llama-bench (pp512, tg64) and llama-batched-bench (16 x 32+64)"
  if "$LLAMA_BIN/llama-bench" -m "$f" -t "$THREADS" -p 512 -n 64 -r "$REPS" -o json \
    >"$p-bench.json" 2>"$p-bench.err"; then
    IFS=$'\t' read -r pp tg mtype commit < <("${PY[@]}" llama-bench "$p-bench.json")
    record "$m" "$r" engine - decode_1 llama "$tg"
    record "$m" "$r" engine - prefill_512 llama "$pp"
    record "$m" "$r" note - - llama "llama-bench: $mtype, build $commit"
  else
    record "$m" "$r" engine - decode_1 llama "FAIL: $(why "$p-bench.err")"
    record "$m" "$r" engine - prefill_512 llama "FAIL: $(why "$p-bench.err")"
  fi
  : >"$p-batched.jsonl"
  for i in $(seq "$REPS"); do
    if ! "$LLAMA_BIN/llama-batched-bench" -m "$f" -t "$THREADS" -c $((16 * (PROMPT + OUTPUT))) \
      -npp "$PROMPT" -ntg "$OUTPUT" -npl 16 --output-format jsonl >>"$p-batched.jsonl" \
      2>"$p-batched.err"; then
      record "$m" "$r" engine - decode_16 llama "FAIL: $(why "$p-batched.err")"
      return
    fi
  done
  tgs=$("${PY[@]}" batched "$p-batched.jsonl")
  record "$m" "$r" engine - decode_16 llama "${tgs#16:}"
}

# engine_pair FILE NAME ROUND: the machine's bandwidth, then both sides, in the round's order.
engine_pair() {
  local f=$1 m=$2 r=$3 bw wb floor side v
  say "round $r, $m: read bandwidth (engine-bench on synthetic:tiny)"
  "$ENGINE" --model synthetic:tiny --threads "$THREADS" --reps "$REPS" >"$OUT/bw-$m-r$r.json" \
    2>"$OUT/bw-$m-r$r.err"
  bw=$("${PY[@]}" get "$OUT/bw-$m-r$r.json" mem_bw_gbs)
  wb=${WEIGHT_BYTES[$m]}
  floor=$(awk -v bw="$bw" -v wb="$wb" 'BEGIN { printf "%.2f", bw * 1e9 / wb }')
  record "$m" "$r" note - - - "read bandwidth $bw GB/s, $(awk -v wb="$wb" \
    'BEGIN { printf "%.3f", wb / 1e9 }') GB of weights a decode step: floor $floor tok/s at batch 1"
  if [ $((r % 2)) -eq 1 ]; then
    engine_sluice "$f" "$m" "$r"
    engine_llama "$f" "$m" "$r"
  else
    engine_llama "$f" "$m" "$r"
    engine_sluice "$f" "$m" "$r"
  fi
  for side in sluice llama; do
    v=$(awk -F'\t' -v m="$m" -v r="$r" -v s="$side" \
      '$1 == m && $2 == r && $5 == "decode_1" && $6 == s { print $7 }' "$RES")
    if [[ $v =~ ^[0-9.]+$ ]]; then
      record "$m" "$r" engine - decode_1_floor "$side" \
        "$(awk -v v="$v" -v f="$floor" 'BEGIN { printf "%.3f", v / f }')"
    fi
  done
}

# served_arm SIDE FILE NAME ROUND USERS
served_arm() {
  local side=$1 f=$2 m=$3 r=$4 u=$5 p=$OUT/$3-r$4-u$5-$1 url out ttft tpot ndone per failed
  local k
  say "round $r, $m: $side served, $u users, $((u * (REQUESTS + 1))) requests"
  if [ "$side" = sluice ]; then
    if [ -n "${SLUICE_BAD[$m]:-}" ]; then
      for k in out_tok_s ttft_p50 tpot_p50; do
        record "$m" "$r" served "$u" "$k" sluice "FAIL: ${SLUICE_BAD[$m]}"
      done
      return
    fi
    if ! start_sluice "$OUT/$m-sluice.json" >/dev/null 2>"$p.err"; then
      SLUICE_BAD[$m]="sluice did not start: $(why "$OUT/sluice.log")"
      cp "$OUT/sluice.log" "$p.log"
      say "${SLUICE_BAD[$m]}"
      served_arm "$@"
      return
    fi
    url=$URL
  else
    if ! start_llama "$f" "$p.log"; then
      for k in out_tok_s ttft_p50 tpot_p50; do
        record "$m" "$r" served "$u" "$k" llama "FAIL: llama-server did not start: $(why "$p.log")"
      done
      return
    fi
    url=$LLAMA_URL
  fi
  local rc=0
  "$BENCH" --url "$url" --no-progress --concurrency "$u" --num-warmups "$u" \
    --num-requests $((u * REQUESTS)) --prompt "$PROMPT" --output "$OUTPUT" --ignore-eos \
    --label "$side-u$u-r$r" --json "$p.json" --summary "$OUT/$m-served.tsv" >"$p.txt" 2>&1 ||
    rc=$?
  if [ "$side" = sluice ]; then
    stop_sluice
    cp "$OUT/sluice.log" "$p.log"
  else
    stop_llama
  fi
  if [ "$rc" != 0 ] || [ ! -s "$p.json" ]; then
    record "$m" "$r" served "$u" out_tok_s "$side" "FAIL: sluice-bench: $(why "$p.txt")"
    return
  fi
  IFS=$'\t' read -r out ttft tpot ndone per failed < <("${PY[@]}" served "$p.json")
  record "$m" "$r" served "$u" out_tok_s "$side" "$out"
  record "$m" "$r" served "$u" ttft_p50 "$side" "$ttft"
  record "$m" "$r" served "$u" tpot_p50 "$side" "$tpot"
  record "$m" "$r" served "$u" tok_per_req "$side" "$per"
  record "$m" "$r" served "$u" completed "$side" "$ndone"
  if [ "$per" != "$OUTPUT.0" ] || [ "$failed" != 0 ]; then
    record "$m" "$r" note - - "$side" \
      "$side, $u users: $per tokens a request (not $OUTPUT), $failed requests failed ($p.txt)"
  fi
}

declare -A WEIGHT_BYTES=()
NAMES=()
for f in "${MODELS[@]}"; do
  m=$(basename "$f" .gguf)
  NAMES+=("$m")
  IFS=$'\t' read -r wb types < <("${PY[@]}" gguf "$f")
  WEIGHT_BYTES[$m]=$wb
  record "$m" 0 note - - - "$(readlink -f "$f"), $(du -h "$f" | cut -f1), tensors $types"
  # admission off: requests queue as they do in llama-server, instead of being refused for a
  # predicted TTFT over the interactive tier's objective (1 s), which a 1.1B model on 2 vCPUs
  # misses at 16 users.
  printf '{"model": "%s", "threads": %d, "max_seqs": %d, "max_batch_tokens": 512, %s}\n' \
    "$(readlink -f "$f")" "$THREADS" "$MAX_USERS" '"admission": false, "log_level": "info"' \
    >"$OUT/$m-sluice.json"
done

{
  echo "== sluice against llama.cpp, side by side (issue 32)"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), nproc $(nproc)"
  echo "before: $(uptime)"
  echo "sluice: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') ($BUILD)"
  echo "llama.cpp: $("$LLAMA_BIN/llama-server" --version 2>&1 | grep -m1 version || echo '?')" \
    "($LLAMA_BIN)"
  echo "threads $THREADS, rounds $ROUNDS, reps $REPS; served: users $USERS, prompt $PROMPT," \
    "output $OUTPUT, $REQUESTS requests a user after one warm-up; parts $PARTS; logs in $OUT"
} | tee "$REPORT"

for i in "${!MODELS[@]}"; do
  f=${MODELS[$i]} m=${NAMES[$i]}
  for r in $(seq "$ROUNDS"); do
    [[ ,$PARTS, == *,engine,* ]] && engine_pair "$f" "$m" "$r"
    if [[ ,$PARTS, == *,served,* ]]; then
      for j in "${!USER_LIST[@]}"; do
        u=${USER_LIST[$j]}
        if [ $(((r + j) % 2)) -eq 1 ]; then
          served_arm sluice "$f" "$m" "$r" "$u"
          served_arm llama "$f" "$m" "$r" "$u"
        else
          served_arm llama "$f" "$m" "$r" "$u"
          served_arm sluice "$f" "$m" "$r" "$u"
        fi
      done
    fi
  done
done

{
  echo "after: $(uptime)"
  "${PY[@]}" render "$RES"
  echo
  [[ ,$PARTS, == *,engine,* ]] && echo "(engine: best of $REPS; sluice decodes at context 32" \
    "(batch 1) and 64 (batch 16), llama.cpp from 0 to 64 and from 32 to 96)"
  echo "(sluice / llama.cpp: above 1 favours sluice for tok/s, below 1 for TTFT and TPOT)"
} | tee -a "$REPORT"

if [ -n "$SAVE" ]; then
  dest=$ROOT/bench/results/$(date -u +%F)-peer.md
  [ -s "$dest" ] && printf '\n---\n\n' >>"$dest"
  cat "$REPORT" >>"$dest"
  echo "peer: appended to $dest" >&2
fi
