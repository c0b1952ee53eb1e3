#!/bin/sh
# Pairs this tree's CPU kernels against another revision's inside one engine-bench process:
#   bench/paired.sh OLD_REV [engine-bench arguments, e.g. --only-decode 32]
# prints engine-bench's JSON, then (stderr) new/old mean forward time and, for decode steps, the
# same per phase of the step (qkv, attention, classifier, ...).
#
# Why: on the shared 2-vCPU VM this project is measured on, the same binary's batch-32 step moves
# between 10 and 14 ms within minutes, so two runs one after the other cannot resolve a change of a
# few per cent. Here forwards alternate between the two versions (even: OLD_REV's, odd: this
# tree's), so both see the same host. Run the A/A (OLD_REV = HEAD) beside a comparison, and repeat
# both. Pass --only-decode B or --only-prefill N: a whole run's forwards are of every size, and the
# mean forward time of each side then depends on which side drew the large ones.
#
# How: a paired build (include/sluice/kernels.h, "Paired builds"; meson -Dpaired_avx2=FILE)
# compiles OLD_REV's kernels/cpu/avx2.c beside this tree's, its names renamed, and engine-bench
# switches its AVX2 matmul and decode-row attention in and out forward by forward. Everything else
# is this tree's, committed or not, on both sides: on a CPU with AVX-512 the matmul of three rows
# or more runs kernels/cpu/avx512.c, so pass --isa avx2 to pair avx2.c's matmul there (without
# it, the per-phase times of one side are still a breakdown of a step). OLD_REV's avx2.c must
# compile against this tree's kernels/cpu/cpu_impl.h and define both entry points with today's
# signatures. The build folder is a temporary one, removed at exit; set JOBS to limit ninja.
set -eu
[ $# -ge 1 ] || { echo "usage: bench/paired.sh OLD_REV [engine-bench arguments]" >&2; exit 2; }
old=$1
shift
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" show "$old:kernels/cpu/avx2.c" >"$work/avx2_old.c"
meson setup -Dcuda=disabled -Dtests=false -Dpaired_avx2="$work/avx2_old.c" "$work/build" "$root" \
    >"$work/setup.log" || { cat "$work/setup.log" >&2; exit 1; }
ninja -C "$work/build" -j "${JOBS:-$(nproc)}" bench/engine-bench >"$work/build.log" ||
    { cat "$work/build.log" >&2; exit 1; }
"$root/bench/foreground.sh" "$work/build/bench/engine-bench" "$@"
