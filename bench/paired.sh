#!/bin/sh
# Pairs this tree's CPU kernels against another revision's inside one engine-bench process:
#   bench/paired.sh OLD_REV [engine-bench arguments, e.g. --only-decode 32]
# prints engine-bench's JSON, then (stderr) new/old mean forward time and, for decode steps, the
# same per phase of the step (qkv, attention, classifier, ...).
#
# Why: on the shared 2-vCPU VM this project is measured on, the same binary's batch-32 step moves
# between 10 and 14 ms within minutes, so two runs one after the other cannot resolve a change of a
# few per cent. Here forwards alternate between the two versions (even: OLD_REV's
# kernels/cpu/avx2.c, compiled as a second copy of sl_cpu_avx2_matmul_cols and
# sl_cpu_avx2_attention_row; odd: this tree's), so both see the same host. With the same file on
# both sides this script read 0.998 at batch 32 and 1.031-1.045 on a prompt (a hand-built
# forerunner 1.007 at batch 32 and 1.01-1.02 at batch 1): run the A/A (OLD_REV = HEAD) beside a
# comparison, and repeat both. Kernels other than those two functions are this tree's on both
# sides: on a CPU with AVX-512 the matmul of three rows or more runs kernels/cpu/avx512.c, so pass
# --isa avx2 to pair avx2.c's matmul there (without it, the per-phase times of one side are still
# a breakdown of a step). Works while bench/paired.patch (the timing and the switch, in worker/cpu_backend.c and
# kernels/cpu/ops.c) applies to this tree.
set -eu
[ $# -ge 1 ] || { echo "usage: bench/paired.sh OLD_REV [engine-bench arguments]" >&2; exit 2; }
old=$1
shift
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add -q -d "$work/tree" HEAD
cp "$root/kernels/cpu/avx2.c" "$work/tree/kernels/cpu/avx2.c" # this tree's, committed or not
git -C "$work/tree" apply "$root/bench/paired.patch"
git -C "$root" show "$old:kernels/cpu/avx2.c" >"$work/tree/kernels/cpu/avx2_old.c"
cd "$work/tree"
meson setup -Dcuda=disabled build >/dev/null
cd build
# Everything engine-bench links but engine-bench itself, whose link needs the old copy below.
ninja $(ninja -t query bench/engine-bench | sed -n '/input:/,/outputs:/p' | grep -E '^ +(\| )?[a-z]+/' |
    sed 's/^ *| *//; s/^ *//') >/dev/null
# OLD_REV's file, compiled exactly as meson compiles avx2.c, its two entry points renamed and
# every other symbol made local, then linked into engine-bench beside this tree's.
cmd=$(python3 -c 'import json
for e in json.load(open("compile_commands.json")):
    if e["file"].endswith("kernels/cpu/avx2.c"):
        print(e["command"])')
cmd=$(printf '%s\n' "$cmd" | sed 's#\.\./kernels/cpu/avx2\.c$#../kernels/cpu/avx2_old.c#; s#-o [^ ]*avx2\.c\.o#-o ../old.o#; s#-MD -MQ [^ ]* -MF [^ ]*##')
sh -c "$cmd"
objcopy --redefine-sym sl_cpu_avx2_matmul_cols=old_matmul_cols \
    --redefine-sym sl_cpu_avx2_attention_row=old_attention_row ../old.o ../old2.o
objcopy -G old_matmul_cols -G old_attention_row ../old2.o ../old3.o
sh -c "$(ninja -t commands bench/engine-bench | tail -1) ../old3.o"
cd "$root"
"$root/bench/foreground.sh" "$work/tree/build/bench/engine-bench" "$@"
