#!/usr/bin/env bash
# The main job: builds and runs the fused MLP example (the MoE layer takes its place once it
# exists), on the GPU when one is present, else on the CPU executor.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${LOOM_SKIP_DEPS:-}" ] || bash scripts/install-deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target fused_mlp
./build/examples/fused_mlp --backend auto "$@"
