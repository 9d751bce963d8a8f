#!/usr/bin/env bash
# Configures, builds and runs every test suite. GPU suites skip where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${LOOM_SKIP_DEPS:-}" ] || bash scripts/install-deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
ctest --preset default -j "$(nproc)"
