#!/usr/bin/env bash
# Installs whatever sluice needs that is missing (Debian 12 packages only), then configures and
# builds into build/, and installs the SDK test's pinned npm packages (tests/sdk). Does nothing
# but a no-op build when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(gcc libc6-dev pkg-config meson ninja-build libevent-dev libjansson-dev libssl-dev libhiredis-dev
      libcriterion-dev node-llhttp clang-format git)
# The fleet's tests run a real Redis (tests/admission/test_fleet.c starts its own).
pkgs+=(redis-server)
# The fuzz build (tests/fuzz): clang with libFuzzer and the sanitizer runtimes.
pkgs+=(clang libclang-rt-14-dev)
# The SDK test (tests/sdk) runs the official OpenAI client under Node: Debian's nodejs and npm,
# unless a node or npm is already installed some other way (NodeSource, nvm).
if ! command -v node >/dev/null 2>&1; then pkgs+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then pkgs+=(npm); fi
# sluice-bench --plot draws its charts with gnuplot; its test needs it too.
if ! command -v gnuplot >/dev/null 2>&1; then pkgs+=(gnuplot-nox); fi
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  echo "setup: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
fi

if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build

# The pinned openai and @anthropic-ai/sdk packages for the SDK tests (tests/sdk/package-lock.json);
# npm ci runs again only when the lock file has changed since the last install.
stamp=tests/sdk/node_modules/.sluice-lock
if ! cmp -s tests/sdk/package-lock.json "$stamp"; then
  echo "setup: npm ci in tests/sdk"
  (cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp tests/sdk/package-lock.json "$stamp"
fi
