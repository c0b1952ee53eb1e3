#!/usr/bin/env bash
# The GPU device check's bundle (issue 25): a self-contained folder that runs the CUDA tests and
# benchmarks on a machine that has a GPU but none of sluice's libraries and no package registry.
#
#   scripts/gpu-check.sh prepare [--build DIR] [--out DIR] [--baseline DIR]
#       Builds (here; no GPU needed) and fills OUT (default .gpu/, git-ignored):
#         sluice, bench/sluice-bench, bench/engine-bench, tests/test_kernels, tests/test_worker
#                     stripped; the CUDA tests are in the two test executables
#         lib/        every shared library they load but those of ALLOWED below (the C runtime,
#                     the NVIDIA driver, cuBLAS: run.sh finds cuBLAS on the GPU machine)
#         models/     ../shared/models (the real tiny models and their goldens), when present
#         scenarios/  bench/scenarios' flood.sh and lib.sh, with GPU configurations
#         run.sh, served.py, report.py, *.json   the check itself (scripts/gpu/)
#         bundle.env  what was built, and the cuBLAS libraries the binaries need
#       Without --build it configures build-gpu/ (release, -Dcuda=enabled: sm_90 code and
#       compute_90 PTX); with --build it uses that folder as it is (it must have CUDA).
#       --baseline DIR adds DIR's bench/engine-bench (a CUDA build of another commit) as
#       bench/engine-bench-base, which run.sh's base step measures beside this build's.
#       Then it runs verify on OUT, and fails when OUT is over 60 MiB.
#   scripts/gpu-check.sh verify [DIR]
#       Checks that every executable and library in DIR (default .gpu/) resolves each library it
#       needs inside DIR/lib or among ALLOWED; prints each one that does not, and fails.
#
# On the GPU machine (see README.md, "GPU check"): carry .gpu and run `.gpu/run.sh`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# Libraries that a bundle may take from the machine it runs on: the C runtime and the dynamic
# loader (libresolv too: it is glibc's own and uses glibc's private symbols, so a copy from this
# machine's older glibc would not load beside the GPU machine's), the C++ runtime and libgcc_s
# (cudart and cuBLAS's), the NVIDIA driver (libcuda; cudart loads it with dlopen), and cuBLAS
# (hundreds of MB: the GPU machine has it, run.sh finds it).
ALLOWED='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libgcc_s\.so\.1|libstdc\+\+\.so\.6|libcuda\.so(\.[0-9]+)*|libcublas(Lt)?\.so(\.[0-9]+)*)$'
MAX_MIB=60
BINARIES=(sluice bench/sluice-bench bench/engine-bench tests/kernels/test_kernels
  tests/worker/test_worker)

die() {
  echo "gpu-check: $*" >&2
  exit 1
}

# libs FILE: "soname path" for each library ldd resolves for FILE ("soname not-found" for one it
# cannot find), with LD_LIBRARY_PATH as the caller set it.
libs() {
  ldd "$1" 2>/dev/null | awk '
    $2 == "=>" && $3 == "not" { print $1, "not-found"; next }
    $2 == "=>" { print $1, $3; next }
    $1 ~ /^\// { n = split($1, p, "/"); print p[n], $1 }'
}

is_elf() {
  [ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]
}

cmd_verify() {
  local dir
  dir=$(cd "${1:-$ROOT/.gpu}" && pwd) || die "verify: no folder ${1:-$ROOT/.gpu}"
  [ -d "$dir/lib" ] || die "verify: $dir has no lib/ folder: run prepare first"
  local bad=0 n=0 f soname path
  while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    n=$((n + 1))
    while read -r soname path; do
      [ -n "$soname" ] || continue
      if [[ $soname =~ $ALLOWED ]]; then
        continue
      fi
      if [ "$path" = not-found ]; then
        echo "gpu-check: ${f#"$dir"/} needs $soname, which is not in lib/" >&2
        bad=1
      elif [ "$(dirname "$(readlink -f "$path")")" != "$(readlink -f "$dir/lib")" ]; then
        echo "gpu-check: ${f#"$dir"/} loads $soname from $path, outside the bundle's lib/" >&2
        bad=1
      fi
    done < <(LD_LIBRARY_PATH="$dir/lib" libs "$f")
  done < <(find "$dir" -type f -print0)
  [ "$n" -gt 0 ] || die "verify: no executables or libraries in $dir"
  if [ "$bad" -ne 0 ]; then
    die "verify: $dir is not self-contained (the libraries above)"
  fi
  echo "gpu-check: $dir is self-contained: $n executables and libraries resolve inside lib/ or" \
    "among the C runtime, the NVIDIA driver and cuBLAS"
}

cmd_prepare() {
  local build='' out=$ROOT/.gpu baseline=
  while [ $# -gt 0 ]; do
    case $1 in
      --build) build=${2:?--build needs a folder}; shift 2 ;;
      --out) out=${2:?--out needs a folder}; shift 2 ;;
      --baseline) baseline=${2:?--baseline needs a build folder}; shift 2 ;;
      *) die "prepare: unknown argument $1 (usage: prepare [--build DIR] [--out DIR])" ;;
    esac
  done
  if [ -z "$build" ]; then
    build=$ROOT/build-gpu
    if [ ! -f "$build/build.ninja" ]; then
      meson setup "$build" "$ROOT" --buildtype=release -Dcuda=enabled -Dtests=true
    fi
  fi
  [ -f "$build/build.ninja" ] || die "prepare: $build is not a configured build folder"
  grep -q 'define SL_HAVE_CUDA 1' "$build/sl_build_config.h" 2>/dev/null ||
    die "prepare: $build was configured without CUDA (meson setup -Dcuda=enabled)"
  ninja -C "$build" "${BINARIES[@]}"

  case $out in /* | ./* | ../*) ;; *) out=./$out ;; esac
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  [ "$out" != "$ROOT" ] && [ "$out" != / ] || die "prepare: will not fill $out"
  rm -rf "${out:?}"/*
  mkdir -p "$out/lib" "$out/bench" "$out/tests" "$out/scenarios"

  local b dst
  for b in "${BINARIES[@]}"; do
    case $b in
      tests/*) dst=$out/tests/$(basename "$b") ;;
      *) dst=$out/$b ;;
    esac
    strip --strip-unneeded -o "$dst" "$build/$b" 2>/dev/null || cp "$build/$b" "$dst"
    chmod 755 "$dst"
  done

  local base_commit=
  if [ -n "$baseline" ]; then
    [ -x "$baseline/bench/engine-bench" ] || die "prepare: $baseline has no bench/engine-bench"
    grep -q 'define SL_HAVE_CUDA 1' "$baseline/sl_build_config.h" 2>/dev/null ||
      die "prepare: $baseline was configured without CUDA"
    strip --strip-unneeded -o "$out/bench/engine-bench-base" "$baseline/bench/engine-bench" \
      2>/dev/null || cp "$baseline/bench/engine-bench" "$out/bench/engine-bench-base"
    chmod 755 "$out/bench/engine-bench-base"
    local base_src
    base_src=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' \
      "$baseline/meson-info/meson-info.json" 2>/dev/null || echo "$baseline")
    base_commit=$(git -C "$base_src" describe --always --dirty 2>/dev/null || echo unknown)
  fi

  # The libraries, as ldd resolves them here, each under its soname.
  local soname path cublas=()
  for b in "${BINARIES[@]}"; do
    while read -r soname path; do
      [ -n "$soname" ] || continue
      [ "$path" != not-found ] || die "prepare: $b needs $soname, which this machine lacks"
      if [[ $soname =~ ^libcublas ]]; then
        cublas+=("$soname")
      elif ! [[ $soname =~ $ALLOWED ]] && [ ! -e "$out/lib/$soname" ]; then
        cp -L "$path" "$out/lib/$soname"
        chmod 644 "$out/lib/$soname"
      fi
    done < <(libs "$build/$b")
  done

  local models=$ROOT/../shared/models
  if [ -d "$models" ]; then
    cp -rL "$models" "$out/models"
    chmod -R u+w "$out/models"
  else
    echo "gpu-check: $models not found: the bundle has no real models (their tests will skip)" >&2
  fi

  cp "$ROOT"/scripts/gpu/run.sh "$ROOT"/scripts/gpu/served.py "$ROOT"/scripts/gpu/report.py \
    "$ROOT"/scripts/gpu/serve-llama-1b.json "$out/"
  cp "$ROOT"/bench/scenarios/lib.sh "$ROOT"/bench/scenarios/flood.sh "$out/scenarios/"
  cp "$ROOT"/scripts/gpu/flood.json "$ROOT"/scripts/gpu/flood-off.json "$out/scenarios/"
  chmod 755 "$out/run.sh" "$out/scenarios/flood.sh"

  {
    echo "# Written by scripts/gpu-check.sh prepare; read by run.sh."
    echo "BUNDLE_COMMIT=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "BUNDLE_DATE=$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "BUNDLE_BUILD=$(basename "$build")"
    echo "BUNDLE_BUILDTYPE=$(meson introspect --buildoptions "$build" 2>/dev/null |
      python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "buildtype"))' 2>/dev/null || echo unknown)"
    echo "BASELINE_COMMIT=$base_commit"
    echo "CUBLAS_SONAMES=\"$(printf '%s\n' "${cublas[@]}" | sort -u | tr '\n' ' ' | sed 's/ $//')\""
  } >"$out/bundle.env"

  cmd_verify "$out"
  local mib
  mib=$(du -sm "$out" | cut -f1)
  [ "$mib" -le "$MAX_MIB" ] || die "prepare: $out is $mib MiB, over the $MAX_MIB MiB it may take"
  echo "gpu-check: $out ready ($mib MiB); on the GPU machine carry it and run $(basename "$out")/run.sh"
}

case ${1:-} in
  prepare) shift; cmd_prepare "$@" ;;
  verify) shift; cmd_verify "$@" ;;
  *) die "usage: scripts/gpu-check.sh prepare [--build DIR] [--out DIR] | verify [DIR]" ;;
esac
