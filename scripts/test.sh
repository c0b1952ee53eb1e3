#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite. Tests that need ../shared/models skip with a
# message when it is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

meson test -C build --print-errorlogs --num-processes 1 -v
rc=$?

# Formatting is part of the suite (.clang-format at the root).
if ! git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror; then
  echo "format: the files above differ from .clang-format; run clang-format -i on them"
  rc=1
fi

# One closing line over every criterion executable, from the synthesis lines they printed.
awk '/Synthesis: Tested:/ {
       for (i = 1; i <= NF; i++) {
         if ($i == "Tested:") t += $(i + 1); if ($i == "Passing:") p += $(i + 1);
         if ($i == "Failing:") f += $(i + 1); if ($i == "Crashing:") c += $(i + 1);
       }
     }
     END { printf "criterion: %d passed, %d failed\n", p, f + c }' build/meson-logs/testlog.txt
exit $rc
