#!/usr/bin/env bash
# Builds the cuda preset here and copies the GPU programs into build/device-bin, the folder a
# device call carries (the device machine has no package registry to build the CPU-side
# dependencies from).
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/bootstrap.sh
cmake --preset cuda >/dev/null
cmake --build --preset cuda -j "$(nproc)" --target test_moe_layer test_ep_layer test_grouped_gemm test_planned_gemm cuda_layer_bench ep_exchange_bench tile_signal_bench signal_cost_bench planned_gemm_stress device_plan_bench tilemoe
rm -rf build/device-bin
mkdir -p build/device-bin
cp build/cuda/tests/cuda/{test_moe_layer,test_ep_layer,test_grouped_gemm,test_planned_gemm} \
   build/cuda/bench/{cuda_layer_bench,ep_exchange_bench,tile_signal_bench,signal_cost_bench,planned_gemm_stress,device_plan_bench} \
   build/cuda/tools/tilemoe/tilemoe build/device-bin/
git rev-parse HEAD >build/device-bin/COMMIT
git status --porcelain | grep -q . && echo "(with uncommitted changes)" >>build/device-bin/COMMIT
du -sh build/device-bin
