#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite twice: the normal build (build/) and an
# AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/), where any report fails the
# run. Tests that need ../shared/models skip with a message when it is absent.
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

# Formatting is part of the suite (.clang-format at the root).
if ! git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror; then
  echo "format: the files above differ from .clang-format; run clang-format -i on them"
  rc=1
fi

# One closing line over every criterion executable of both builds, from their synthesis lines.
awk '/Synthesis: Tested:/ {
       for (i = 1; i <= NF; i++) {
         if ($i == "Passing:") p += $(i + 1);
         if ($i == "Failing:") f += $(i + 1); if ($i == "Crashing:") c += $(i + 1);
       }
     }
     END { printf "criterion: %d passed, %d failed\n", p, f + c }' \
  build/meson-logs/testlog.txt build-asan/meson-logs/testlog.txt
exit $rc
