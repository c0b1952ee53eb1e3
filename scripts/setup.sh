#!/usr/bin/env bash
# Installs whatever sluice needs that is missing (Debian 12 packages only), then configures and
# builds into build/. Does nothing but a no-op build when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(gcc libc6-dev pkg-config meson ninja-build libevent-dev libjansson-dev libssl-dev
      libcriterion-dev node-llhttp clang-format git)
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
