#!/usr/bin/env bash
# The main job: builds and runs the fused MoE layer (loom-moe) with a check against the float64
# reference, on the GPU when one is present, else on the CPU executor. Extra arguments go to
# loom-moe (see scripts/run.sh --help).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${LOOM_SKIP_DEPS:-}" ] || bash scripts/install-deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target loom-moe
exec ./build/moe/loom-moe --check "$@"
