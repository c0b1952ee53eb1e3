#!/usr/bin/env bash
# Installs whatever sluice needs that is missing (Debian 12 packages only), then configures and
# builds into build/, and installs the pinned npm packages of the SDK tests (tests/sdk), the
# deploy check (tests/deploy) and the dashboard's browser test (tests/dashboard). Does nothing
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
# The deploy check (tests/deploy/check.sh) runs nginx -t and nginx in front of sluice on
# loopback, and systemd-analyze on deploy/systemd (never as a service: see below).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then pkgs+=(nginx); fi
if ! command -v systemd-analyze >/dev/null 2>&1; then pkgs+=(systemd); fi
# The dashboard's browser test (tests/dashboard) drives Debian's Chromium headless, with a font
# for its text.
if [ ! -x /usr/bin/chromium ]; then pkgs+=(chromium); fi
pkgs+=(fonts-dejavu-core)
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
  # The nginx package would start the system-wide service on port 80; a policy-rc.d keeps every
  # package's service stopped while they install (as bench/http/run.sh does).
  policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d
    policy_added=1
  fi
  "${sudo[@]}" apt-get update -q
  rc=0
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}" || rc=$?
  if ((policy_added)); then "${sudo[@]}" rm -f /usr/sbin/policy-rc.d; fi
  if ((rc)); then exit "$rc"; fi
fi

if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build

# The pinned npm packages of the SDK tests (tests/sdk: openai, @anthropic-ai/sdk), of the
# deploy check (tests/deploy: kubernetes-models, yaml) and of the dashboard's browser test
# (tests/dashboard: playwright-core, which drives Debian's Chromium and downloads no browser);
# npm ci runs again in a folder only when its lock file has changed since the last install.
for dir in tests/sdk tests/deploy tests/dashboard; do
  stamp=$dir/node_modules/.sluice-lock
  if ! cmp -s "$dir/package-lock.json" "$stamp"; then
    echo "setup: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$dir/package-lock.json" "$stamp"
  fi
done
