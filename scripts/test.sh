#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite twice: the normal build (build/) and an
# AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/, LeakSanitizer on), where any
# report fails the run; then builds the libFuzzer targets with clang (build-fuzz/) and runs each
# for SLUICE_FUZZ_SECONDS (default 45) seconds, where a crash fails the run (tests/fuzz/README.md).
# Tests that need ../shared/models skip with a message when it is absent, or fail when
# SLUICE_REQUIRE_MODELS=1 (as .ci/run sets it: CI always has ../shared beside the checkout).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

rc=0
meson test -C build --print-errorlogs --num-processes 1 -v || rc=1

if [ ! -f build-asan/build.ninja ]; then
  meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false || exit 1
fi
ninja -C build-asan || exit 1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  meson test -C build-asan --print-errorlogs --num-processes 1 -t 4 || rc=1
# criterion counts a test whose process LeakSanitizer reports at exit as passed (it only warns
# that the test "crashed during its setup or teardown"), so reports are looked for in the log.
if grep -E 'ERROR: (LeakSanitizer|AddressSanitizer)|SUMMARY: UndefinedBehaviorSanitizer|runtime error:|crashed during its setup or teardown' \
  build-asan/meson-logs/testlog.txt; then
  echo "asan: the sanitizer reports above fail the run"
  rc=1
fi

# Fuzzing: every target of tests/fuzz for a bounded time, two at a time (tests/fuzz/run.sh).
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Dtests=false -Db_sanitize=address,undefined \
    -Db_lundef=false || exit 1
fi
ninja -C build-fuzz || exit 1
tests/fuzz/run.sh -t "${SLUICE_FUZZ_SECONDS:-45}" build-fuzz || rc=1

# Formatting is part of the suite (.clang-format at the root).
if ! git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror; then
  echo "format: the files above differ from .clang-format; run clang-format -i on them"
  rc=1
fi

# One closing line over every criterion executable of both builds, from their synthesis lines;
# criterion's synthesis leaves skipped tests out (its "Tested:" counts only those that ran), so
# they are counted from the "[SKIP] suite::name: reason" lines of --verbose (those a --filter
# disables say "Test is disabled"; the suite runs none).
awk '/Synthesis: Tested:/ {
       for (i = 1; i <= NF; i++) {
         if ($i == "Passing:") p += $(i + 1);
         if ($i == "Failing:") f += $(i + 1); if ($i == "Crashing:") c += $(i + 1);
       }
     }
     /\[SKIP\] [^ ]+::/ && !/: Test is disabled/ { s++ }
     END { printf "criterion: %d passed, %d failed, %d skipped\n", p, f + c, s }' \
  build/meson-logs/testlog.txt build-asan/meson-logs/testlog.txt
# CI keeps only the tail of a long log: name what failed there, with criterion's assertion lines
# (file:line and message) and meson's failed suites, so a failure can be found without the log.
for log in build/meson-logs/testlog.txt build-asan/meson-logs/testlog.txt; do
  awk -v f="$log" '/^test: / { t = $0 }
    /^result: / && !/exit status 0/ { print f ": " t " " $0 }
    /^\[FAIL\] |^\[----\] [^ ]+:[0-9]+: / { if (n++ < 40) print f ": " $0 }' "$log"
done
exit $rc
