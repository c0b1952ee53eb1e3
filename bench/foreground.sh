#!/bin/sh
# Runs a benchmark in a session of its own whose scheduler autogroup has nice -20, e.g.
#   bench/foreground.sh build/bench/engine-bench
#
# Why: with CONFIG_SCHED_AUTOGROUP (on in Debian's kernels, /proc/sys/kernel/sched_autogroup_enabled)
# the scheduler first shares the CPUs between sessions and only then between the tasks of one
# session by their nice values. A nice-19 job started from another session (a fuzzer, a build) then
# gets as much CPU as the benchmark's whole session: on a 2-vCPU machine it takes one of the two
# cores from a two-thread engine-bench, and every step waits at its thread barriers. Giving the
# benchmark's own autogroup nice -20 restores what "nice 19 in the background" is meant to mean
# (weights 88761 against 1024, about 1 %). Needs root (or CAP_SYS_NICE); without it the benchmark
# runs at the ordinary weight and this says so.
set -eu
[ $# -ge 1 ] || { echo "usage: bench/foreground.sh COMMAND [ARG...]" >&2; exit 2; }
exec setsid sh -c '
    if ! echo -20 2>/dev/null >/proc/self/autogroup; then
        echo "bench/foreground.sh: cannot set the autogroup nice (not root?): running as is" >&2
    fi
    exec "$@"' sh "$@"
