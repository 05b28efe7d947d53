#!/usr/bin/env bash
# Installs the Debian 12 packages tandem's build and tests need, only when some are missing, and
# the server tests' npm packages. Quick when everything is present. Non-interactive; needs root
# or sudo to install.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  libhwloc-dev libnuma-dev libpcre2-dev libyaml-cpp-dev
  clang libclang-rt-14-dev   # libFuzzer for the `slow` fuzz tests
  curl                       # the server tests' command-line client
  chromium                   # the chat page's test (headless, driven by puppeteer-core)
  # the Python module (pybind11) and its tests (torch, pytest); setuptools for `pip install .`
  python3-dev pybind11-dev python3-torch python3-numpy python3-pytest python3-setuptools
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm for the server tests' OpenAI SDK client (any install will do: Debian's packages
# when there is none).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -ne 0 ]; then
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
fi

# The server tests' Node.js clients (the OpenAI and Anthropic SDKs, puppeteer-core for the chat
# page), pinned by the lock file.
node_tests="$(dirname "$0")/../tests/server/node"
need_npm=0
for m in openai @anthropic-ai/sdk puppeteer-core; do
  [ -d "$node_tests/node_modules/$m" ] || need_npm=1
done
if [ "$need_npm" -eq 1 ]; then
  echo "bootstrap: npm ci in tests/server/node (the clients the server tests drive it with)"
  (cd "$node_tests" && npm ci --no-audit --no-fund --loglevel=error)
fi
