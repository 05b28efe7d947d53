#!/usr/bin/env bash
# Installs the Debian 12 packages tandem's build and tests need, only when some are missing.
# Quick (one dpkg query) when everything is present. Non-interactive; needs root or sudo to install.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libhwloc-dev libnuma-dev libpcre2-dev libyaml-cpp-dev
  clang libclang-rt-14-dev   # libFuzzer for the `slow` fuzz tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "bootstrap: missing packages (${missing[*]}) and not root; install them and retry" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
