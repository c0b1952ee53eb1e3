#!/usr/bin/env bash
# Runs the libFuzzer targets of a fuzz build (meson -Dfuzz=true, see tests/fuzz/README.md), each
# from its seeds in tests/fuzz/corpus/<target>/, the inputs of bugs found before
# (tests/fuzz/regressions/<target>/) and what earlier runs in the same build folder found
# (BUILD/fuzz/corpus/<target>/), for a bounded time or number of executions. A crash, a
# leak, a sanitizer report or a hang fails the run; its input is kept as
# BUILD/fuzz/artifacts/<target>-crash-* and the log as BUILD/fuzz/logs/<target>.log.
#
#   tests/fuzz/run.sh [-j JOBS] [-t SECONDS] [-r RUNS] BUILD [TARGET...]
#
# -t: seconds per target (default 60); -r: executions per target instead (0: no bound, the
# default); -j: targets at once (default 2). Without TARGETs, every target of BUILD.
set -uo pipefail
cd "$(dirname "$0")/../.."

jobs=2 seconds=60 runs=0
while getopts "j:t:r:" o; do
  case $o in
    j) jobs=$OPTARG ;;
    t) seconds=$OPTARG ;;
    r) runs=$OPTARG ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:?usage: tests/fuzz/run.sh [-j JOBS] [-t SECONDS] [-r RUNS] BUILD [TARGET...]}
shift
targets=("$@")
if ((${#targets[@]} == 0)); then
  for exe in "$build"/tests/fuzz/fuzz_*; do
    [ -x "$exe" ] && [ -f "$exe" ] && targets+=("$(basename "$exe" | sed 's/^fuzz_//')")
  done
fi
if ((${#targets[@]} == 0)); then
  echo "fuzz: no targets in $build/tests/fuzz (configure it with -Dfuzz=true)"
  exit 1
fi

# The dictionary each target's input grammar needs.
dict_of() {
  case $1 in
    http_parser | http_conn) echo tests/fuzz/dict/http.dict ;;
    openai | config | hf_folder | tok_hf | safetensors) echo tests/fuzz/dict/json.dict ;;
    gguf) echo tests/fuzz/dict/gguf.dict ;;
  esac
}

# Longest input for the targets whose inputs need not be long (shorter inputs run faster);
# libFuzzer's default (the longest seed, at least 4096) otherwise.
max_len_of() {
  case $1 in
    tok_spm) echo 1024 ;;
    tok_hf) echo 2048 ;;
  esac
}

out=$build/fuzz
mkdir -p "$out/logs" "$out/artifacts"
run_one() {
  local t=$1 exe=$build/tests/fuzz/fuzz_$1 dict max_len
  dict=$(dict_of "$t")
  max_len=$(max_len_of "$t")
  mkdir -p "$out/corpus/$t"
  local args=(-timeout=30 -rss_limit_mb=4096 -print_final_stats=1
              -artifact_prefix="$out/artifacts/$t-")
  [ -n "$dict" ] && args+=(-dict="$dict")
  [ -n "$max_len" ] && args+=(-max_len="$max_len")
  if ((runs > 0)); then args+=(-runs="$runs"); else args+=(-max_total_time="$seconds"); fi
  # Leaks fail the run (LeakSanitizer, on by default with ASan); UBSan stops at its first report.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$exe" "${args[@]}" "$out/corpus/$t" "tests/fuzz/corpus/$t" \
    $([ -d "tests/fuzz/regressions/$t" ] && echo "tests/fuzz/regressions/$t") \
    >"$out/logs/$t.log" 2>&1
}

rc=0
pids=() names=()
wait_one() {
  local pid=${pids[0]} t=${names[0]}
  pids=("${pids[@]:1}") names=("${names[@]:1}")
  local st=0
  wait "$pid" || st=$?
  local done_line
  done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$out/logs/$t.log" | tail -1)
  local n s
  n=$(awk '/^Done [0-9]+ runs/ {print $2}' <<<"$done_line")
  s=$(awk '/^Done [0-9]+ runs/ {print $5}' <<<"$done_line")
  if ((st == 0)) && [ -n "$done_line" ]; then
    printf 'fuzz: %-12s ok      %12s executions in %5s s (%s exec/s)\n' "$t" "$n" "$s" \
      "$((n / (s > 0 ? s : 1)))"
  else
    printf 'fuzz: %-12s FAILED  (exit %d); log: %s\n' "$t" "$st" "$out/logs/$t.log"
    grep -E 'ERROR: |SUMMARY: |fuzz_check failed|Test unit written' "$out/logs/$t.log" | head -8
    rc=1
  fi
}
for t in "${targets[@]}"; do
  if [ ! -x "$build/tests/fuzz/fuzz_$t" ]; then
    echo "fuzz: no target $t in $build/tests/fuzz"
    rc=1
    continue
  fi
  run_one "$t" &
  pids+=($!) names+=("$t")
  if ((${#pids[@]} >= jobs)); then wait_one; fi
done
while ((${#pids[@]} > 0)); do wait_one; done
exit $rc
