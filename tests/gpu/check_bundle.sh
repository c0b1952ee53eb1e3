#!/usr/bin/env bash
# The GPU check's bundle (scripts/gpu-check.sh, issue 25), tested where there is no GPU:
#   1. prepare fills a folder from this build, and verify finds it self-contained;
#   2. verify fails, naming the library, when one the binaries need is taken out of lib/;
#   3. the bundle's run.sh, with no CUDA device, says so, writes its JSON and exits 0;
#   4. a dry run (GPU_CHECK_DRY=1) of its info and tests steps runs the bundled test executables
#      from the bundle, with the bundle's libraries, and report.py counts what they did.
# usage: check_bundle.sh SOURCE_ROOT BUILD_DIR
set -uo pipefail
src=$1
build=$2
tmp=$(mktemp -d /tmp/sluice-gpu-bundle.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

echo "1. prepare into $tmp/gpu from $build"
"$src/scripts/gpu-check.sh" prepare --build "$build" --out "$tmp/gpu" >"$tmp/prepare.log" 2>&1 ||
  { cat "$tmp/prepare.log"; fail "prepare failed"; }
grep -q 'is self-contained' "$tmp/prepare.log" || fail "prepare did not verify the folder"
for b in sluice bench/sluice-bench bench/engine-bench tests/test_kernels tests/test_worker run.sh; do
  [ -x "$tmp/gpu/$b" ] || fail "the bundle has no executable $b"
done
[ -s "$tmp/gpu/lib/libjansson.so.4" ] || fail "the bundle's lib/ has no libjansson.so.4"
if ls "$tmp/gpu/lib" | grep -E '^(libc\.so|libcublas|libcuda|libstdc\+\+|libresolv)'; then
  fail "lib/ holds a library the GPU machine must provide (above)"
fi
if [ -d "$src/../shared/models" ]; then
  [ -s "$tmp/gpu/models/stories260K.bin" ] && [ -s "$tmp/gpu/models/golden/stories260K.json" ] ||
    fail "the bundle lacks the real models and goldens"
fi

echo "2. verify fails when lib/ lacks a library the binaries need"
mv "$tmp/gpu/lib/libjansson.so.4" "$tmp/libjansson.so.4"
if "$src/scripts/gpu-check.sh" verify "$tmp/gpu" >"$tmp/verify.log" 2>&1; then
  cat "$tmp/verify.log"
  fail "verify passed a bundle without libjansson.so.4"
fi
grep -q 'libjansson.so.4' "$tmp/verify.log" || { cat "$tmp/verify.log"; fail "verify did not name it"; }
mv "$tmp/libjansson.so.4" "$tmp/gpu/lib/"
"$src/scripts/gpu-check.sh" verify "$tmp/gpu" >/dev/null 2>&1 || fail "verify failed once restored"

echo "3. run.sh without a CUDA device"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -c '^GPU ' >/dev/null; then
  echo "   (this machine has a GPU: the no-device case is not tried)"
else
  OUT=$tmp/out "$tmp/gpu/run.sh" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; fail "run.sh exited $?"; }
  grep -q 'no CUDA device' "$tmp/run.log" || { cat "$tmp/run.log"; fail "run.sh did not say why"; }
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["device"] is None, j' \
    "$tmp/out/gpu-check.json" || fail "gpu-check.json is not the no-device object"
  [ -s "$tmp/out/gpu-check.log" ] || fail "run.sh wrote no log"
fi

echo "4. a dry run of the info and tests steps"
GPU_CHECK_DRY=1 OUT=$tmp/dry "$tmp/gpu/run.sh" info tests >"$tmp/dry.log" 2>&1 ||
  { cat "$tmp/dry.log"; fail "the dry run exited $?"; }
python3 - "$tmp/dry/gpu-check.json" <<'PY' || { cat "$tmp/dry.log"; fail "the dry run's report is wrong"; }
import json, sys
j = json.load(open(sys.argv[1]))
assert set(j["steps"]) == {"info", "tests"}, j["steps"]
assert j["steps"]["tests"]["rc"] == "0", j["steps"]
for exe in ("kernels", "worker"):
    t = j["tests"][exe]
    # The bundled executable ran its CUDA tests: without a device each skips and says why, and
    # the tests that need no device pass.
    assert t["failed"] == 0 and t["passed"] >= 1 and t["passed"] + t["skipped"] >= 5, (exe, t)
    assert all("no CUDA device" in s for s in t["skips"]), t["skips"]
assert j["engine_llama_1b"] is None and j["served"] is None
PY
# The listing is taken whole first: with pipefail, `tar | grep -q` fails when grep exits at the
# match before tar has written the rest (tar dies of SIGPIPE), as it did in a CI run.
listing=$(tar tzf "$tmp/dry/gpu-steps.tgz") || fail "gpu-steps.tgz does not read"
grep -q 'tests-kernels.json' <<<"$listing" || fail "gpu-steps.tgz lacks the raw reports"
echo "ok"
