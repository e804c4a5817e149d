#!/usr/bin/env bash
# The one script of a device call: runs the GPU tests, compute-sanitizer and the benchmarks
# from the binaries built here (scripts/device/pack.sh puts them in build/device-bin, which the
# call carries), and leaves everything under $OUT: log.txt (all output), gpu.txt,
# bench.json, ep_bench.json, ts_bench.json, traces.tgz (the Perfetto traces), torch.json, and with the step
# transformers (not in the default list) transformers.json; model-fixtures (not in the default list either) checks
# tests/fixtures/models against this machine's transformers. Usage: scripts/device/run.sh [step ...] (default: all steps).
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared machines
export TILEMOE_CACHE_DIR=${TILEMOE_CACHE_DIR:-$OUT/cache}  # the GPU rates of the SM split, calibrated once per call
out=${OUT:?OUT must name the results folder}
bin=${TILEMOE_DEVICE_BIN:-build/device-bin}
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gemm planned stress stress-skip stress-dynamic layer ep cli cli-ep nccl cli-bench memcheck racecheck planned-sanitize ep-memcheck ep-racecheck bench ep-bench signal-cost plan-compile ts-bench cli-ts torch)
# cuBLAS comes with the toolkit; make sure the loader finds it
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log="$out/log.txt"
status=0
# Perfetto traces go to a folder of their own and come back as one archive, traces.tgz, at the
# end: a call returns only 8 files, and ts-bench writes one trace per case
traces=$(mktemp -d)
bundle_traces() {
  [ -n "$(ls -A "$traces" 2>/dev/null)" ] && tar czf "$out/traces.tgz" -C "$traces" .
  rm -rf "$traces"
}
trap bundle_traces EXIT
trap 'exit 143' TERM  # an outer timeout still leaves the traces written so far

run_step() {
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$log"
  local start=$SECONDS
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$log"
  [ $rc -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
cat "$bin/COMMIT" >>"$out/gpu.txt" 2>/dev/null || true
uname -r >>"$out/gpu.txt"  # which runtime (Firecracker reads hardware counters, gVisor does not)
# a check that must end with exit code $2 and say $3 (within 120 s: never a hang)
expect_exit() {
  local name=$1 want=$2 needle=$3
  shift 3
  echo "== $name (must exit $want): $*" | tee -a "$log"
  local start=$SECONDS text
  text=$(timeout 120 "$@" 2>&1)
  local rc=$?
  echo "$text" >>"$log"
  if [ $rc -eq "$want" ] && grep -qF -- "$needle" <<<"$text"; then
    echo "== $name: exit $rc as expected after $((SECONDS - start)) s" | tee -a "$log"
  else
    echo "== $name: FAIL (exit $rc, expected $want and '$needle')" | tee -a "$log"
    status=1
  fi
}
# bad input: refused with exit code 2 and a message saying why
expect_refusal() { expect_exit "$1" 2 "${@:2}"; }
# a fault injection: a timeout naming the stalled rank (exit 1)
expect_timeout() { expect_exit "$1" 1 "${@:2}"; }

# NCCL's device API has no stable ABI: the binaries run against the NCCL they were built with
# (2.28.9, which PyTorch carries here); the distribution's older one is first in ldconfig
nccl_lib=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib
[ -f "$nccl_lib/libnccl.so.2" ] || nccl_lib=$(dirname "$(find / -path '*nvidia/nccl/lib/libnccl.so.2' -print -quit 2>/dev/null)")
system_nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl.so.2 /{print $NF; exit}')

# The layer's 1024-expert case in the planned GEMM alone (1-row groups) under racecheck: the
# padding-MMA modes and both item fetches, at the case's 1024 groups and at 512, on both
# clusters; then the 1024-group shape launched thousands of times unsanitized. The skip-all
# variants at 1024 groups did not finish under racecheck while every warp of a skipping group
# waited on the stages by itself (2026-12-04); the probe names the waits should one stall again.
race_tiny() {
  local variant
  for variant in "c1x2 issue static 1024" "c1x2 skip-all static 512" "c1x2 skip-all dynamic 512" \
      "c1x2 skip-all static 1024" "c1x2 skip-all dynamic 1024" "c2x1 skip-all static 1024"; do
    set -- $variant
    run_step "racecheck tiny $1 $2 $3 $4 groups" timeout 70 compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$bin/planned_gemm_stress" --cluster "$1" --padding "$2" --fetch "$3" --groups "$4" --rows $(($4 / 2)) --n 256 --k 128 \
      --iterations 1 --limit-s 60 --probe
  done
  run_step "stress tiny c1x2" timeout 120 "$bin/planned_gemm_stress" --cluster c1x2 --groups 1024 --rows 512 --n 256 --k 128 --iterations 3000 --limit-s 5
}

# the cases the one-GPU targets of the layer name (cuda_layer_bench and torch_reference.py take the same flags)
target_cases=(--case mixtral-8x7b:16384 --case deepseek-v3:4096)
# every case of the full sweep: the one-GPU perf cases of the registry (tests/cases)
mapfile -t bench_cases < <("$bin/cuda_layer_bench" --list)

for step in "${steps[@]}"; do
  case $step in
    gemm) run_step gemm "$bin/test_grouped_gemm" ;;
    planned) run_step planned timeout 300 "$bin/test_planned_gemm" ;;
    layer) run_step layer "$bin/test_moe_layer" ;;
    ep) run_step ep "$bin/test_ep_layer" --no-tile-signal
      run_step ep-tile-signal "$bin/test_ep_layer" ;;
    ep-tile-signal) run_step ep-tile-signal "$bin/test_ep_layer" ;;
    perf-cases-tested)  # benchmark cases of the registry in test mode (the oracle on a token sample)
      run_step perf-cases-layer "$bin/test_moe_layer" --case mixtral-8x7b:4096 --case qwen3-30b-a3b:4096
      run_step perf-cases-ep "$bin/test_ep_layer" --case mixtral-8x7b:4096:4 ;;
    ep-small) run_step ep-small "$bin/test_ep_layer" --small ;;  # up to 4 ranks, small shapes, bad input
    ep-racecheck)  # the small cases but 1024 experts (every strategy on each, comet's exchange and combine among
      # them), within the step's bound; the fault tests run unsanitized in ep-small
      case_args=()
      for c in ${EP_RACE_CASES:-two-ranks:200:2 all-to-one-expert-a-rank-without-tokens:129:4 hidden-8:7:2 top-k-equals-experts:33:4 sm-partitions:256:4}; do
        case_args+=(--case "$c")
      done
      run_step ep-racecheck timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_ep_layer" --small "${case_args[@]}" \
        --timeout-s 60 ;;
    ep-memcheck) run_step ep-memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_ep_layer" --small --timeout-s 30 ;;
    memcheck) run_step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_moe_layer" --small ;;
    racecheck)  # one process per small case: a slow or stalled case is named and costs only its own time
      mapfile -t race_cases < <("$bin/test_moe_layer" --small --list)
      if [ ${#race_cases[@]} -eq 0 ]; then echo "== racecheck: FAIL (test_moe_layer --small --list named no case)" | tee -a "$log"; status=1; fi
      for case in "${race_cases[@]}"; do
        run_step "racecheck $case" timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_moe_layer" --small --case "$case" --wait-limit-s 200
      done
      race_tiny ;;
    race-tiny) race_tiny ;;
    planned-sanitize)
      run_step planned-memcheck timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_planned_gemm" --small
      run_step planned-racecheck timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_planned_gemm" --small
      run_step planned-synccheck timeout 150 compute-sanitizer --tool synccheck --error-exitcode 9 "$bin/test_planned_gemm" --small ;;
    bench)  # one process per shape and token count: a stalled phase (named, exit 3) costs one case, not the sweep
      : >"$out/bench.json"
      for case in "${bench_cases[@]}"; do
        rm -f "$out/bench_case.json"  # a run that dies before writing must not repeat the previous case
        # the watchdog bounds the phases; the outer timeout also covers start-up and teardown
        run_step "bench $case" timeout 300 "$bin/cuda_layer_bench" --case "$case" --stall-limit-s 30 --json "$out/bench_case.json"
        cat "$out/bench_case.json" >>"$out/bench.json" 2>/dev/null
      done
      rm -f "$out/bench_case.json" ;;
    stress)  # the planned GEMM launched hundreds of times on fresh row distributions, default padding-MMA mode,
      # both clusters (each variant its own process: a stalled launch ends only its own run, exit 3, and names itself)
      for cluster in c2x1 c1x2; do
        run_step "stress ds-gemm0 $cluster" "$bin/planned_gemm_stress" --cluster $cluster --groups 256 \
          --rows 131072 --n 4096 --k 7168 --iterations 200
        run_step "stress qwen-gemm0 $cluster" "$bin/planned_gemm_stress" --cluster $cluster --groups 128 \
          --rows 131072 --n 1536 --k 2048 --skew 1.5 --iterations 600
        run_step "stress qwen-gemm1 $cluster" "$bin/planned_gemm_stress" --cluster $cluster --groups 128 \
          --rows 131072 --n 2048 --k 768 --skew 1.5 --epilogue store --iterations 600
      done ;;
    stress-dynamic)  # the dynamic item fetch (ItemFetch) on both clusters, on the whole GPU and on 40 SMs
      # (fewer clusters, more items each), default padding MMAs: a lost hand-off would stall a launch
      for cluster in c2x1 c1x2; do
        run_step "stress-dynamic ds-gemm0 $cluster" "$bin/planned_gemm_stress" --cluster $cluster --fetch dynamic \
          --groups 256 --rows 131072 --n 4096 --k 7168 --iterations 100
        run_step "stress-dynamic qwen-gemm1 $cluster" "$bin/planned_gemm_stress" --cluster $cluster --fetch dynamic \
          --groups 128 --rows 131072 --n 2048 --k 768 --skew 1.5 --epilogue store --iterations 600
        run_step "stress-dynamic qwen-gemm1 $cluster 40 SMs" "$bin/planned_gemm_stress" --cluster $cluster --fetch dynamic \
          --sm-limit 40 --groups 128 --rows 131072 --n 2048 --k 768 --skew 1.5 --epilogue store --iterations 100
      done ;;
    stress-skip)  # the padding skips that stalled within 2-450 launches while every warp of a skipping
      # group waited on the stages by itself (2026-12-04), with the probe: a stall names every role's wait
      for variant in "c2x1 skip-all" "c2x1 skip-half" "c1x2 skip-half"; do
        set -- $variant
        run_step "stress-skip $1 $2" "$bin/planned_gemm_stress" --cluster $1 --padding $2 \
          --groups 256 --rows 131072 --n 4096 --k 7168 --iterations 600 --limit-s 5 --probe
      done ;;
    bench-repro)  # the case a sweep sat in for minutes (2026-12-04), three times over, each stall named
      for run in 1 2 3; do
        run_step "bench-repro $run" "$bin/cuda_layer_bench" --case qwen3-30b-a3b:16384 --stall-limit-s 30 \
          --json "$out/bench_repro_$run.json"
      done ;;
    compare-bench|compare-ts)  # the binaries from before a change ($TILEMOE_BEFORE_BIN) against these, case by case,
      # alternating, in this call: the no-regression table (bench/compare_runs.py)
      before=${TILEMOE_BEFORE_BIN:?compare steps need TILEMOE_BEFORE_BIN: the binaries from before the change}
      if [ "$step" = compare-bench ]; then
        for case in "${bench_cases[@]}"; do
          for side in before after; do
            b=$bin; [ $side = before ] && b=$before
            rm -f "$out/bench_case.json"
            run_step "compare-bench $side $case" timeout 300 "$b/cuda_layer_bench" --case "$case" --stall-limit-s 30 --json "$out/bench_case.json"
            cat "$out/bench_case.json" >>"$out/compare_bench_$side.json" 2>/dev/null
          done
        done
        rm -f "$out/bench_case.json"
        python3 bench/compare_runs.py "$out/compare_bench_before.json" "$out/compare_bench_after.json" | tee -a "$log"
      else
        for case in ${TS_COMPARE_CASES:-mixtral-8x7b:4096:4 mixtral-8x7b:4096:8 mixtral-8x7b:16384:4 mixtral-8x7b:16384:8 deepseek-v3:4096:4 deepseek-v3:4096:8 deepseek-v3:16384:4}; do
          for side in before after; do
            b=$bin; [ $side = before ] && b=$before
            rm -f "$out/ts_case.json"
            run_step "compare-ts $side $case" "$b/tile_signal_bench" --case "$case" --json "$out/ts_case.json"
            cat "$out/ts_case.json" >>"$out/compare_ts_$side.json" 2>/dev/null
          done
        done
        rm -f "$out/ts_case.json"
        python3 bench/compare_runs.py "$out/compare_ts_before.json" "$out/compare_ts_after.json" | tee -a "$log"
      fi ;;
    ep-bench) run_step ep-bench "$bin/ep_exchange_bench" --json "$out/ep_bench.json" ;;
    ep-bench-link)
      run_step ep-bench-link "$bin/ep_exchange_bench" --quick --link-gbps 100 --json "$out/ep_bench_link.json"
      run_step ep-bench-partitions "$bin/ep_exchange_bench" --quick --sms-per-rank 32 --json "$out/ep_bench_partitions.json" ;;
    ts-bench) run_step ts-bench "$bin/tile_signal_bench" --json "$out/ts_bench.json" --trace "$traces/tile_signal_trace" ;;
    signal-cost) run_step signal-cost "$bin/signal_cost_bench" --json "$out/signal_cost.json" ;;
    plan-compile) run_step plan-compile "$bin/device_plan_bench" ;;  # the sequential plan compiled on the GPU, timed
    ts-bench-cases)  # chosen cases of ts-bench: TS_CASES="deepseek-v3:4096 deepseek-v3:16384:8" (NAME:TOKENS[:RANKS])
      case_args=()
      for c in ${TS_CASES:?ts-bench-cases needs TS_CASES}; do case_args+=(--case "$c"); done
      run_step ts-bench-cases "$bin/tile_signal_bench" "${case_args[@]}" --json "$out/ts_bench_cases.json" ;;
    ts-bench-quick) run_step ts-bench "$bin/tile_signal_bench" --quick --json "$out/ts_bench.json" --trace "$traces/tile_signal_trace" ;;
    cli-ts) run_step cli-ts "$bin/tilemoe" run --backend cuda --ranks 4 --strategy tile_signal --trace "$traces/cli_tile_signal_trace.json" ;;
    bench-focus)  # the cases the one-GPU targets name, with their clocks and ceilings
      run_step bench-focus "$bin/cuda_layer_bench" "${target_cases[@]}" --raster --stall-limit-s 30 --json "$out/bench_focus.json" ;;
    ncu-gemm)  # hardware counters of one case's first GEMM0 and GEMM1 launches, stock kernels then planned ones
      # (the bench times the stock layer first; Firecracker only, gVisor refuses):
      # NCU_CASE (default mixtral-8x7b:16384), NCU_ROUTING (default balanced)
      for kernel in device_kernel planned_gemm_kernel; do
        run_step "ncu-gemm $kernel" timeout 240 ncu --clock-control none --kernel-name "regex:$kernel" --launch-count 2 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          "$bin/cuda_layer_bench" --case "${NCU_CASE:-mixtral-8x7b:16384}" --routing "${NCU_ROUTING:-balanced}"
      done ;;
    bench-quick) run_step bench "$bin/cuda_layer_bench" --quick --json "$out/bench.json" ;;
    cli) run_step cli "$bin/tilemoe" run --backend cuda --ranks 1 --tokens 512 --hidden 1024 --ffn-hidden 2048 --experts 16 --top-k 4 ;;
    cli-large)  # sizes past the GPU refused at once with the bytes needed; a large step checked on a token sample
      expect_refusal cli-gpu-memory "of GPU memory" "$bin/tilemoe" run --backend cuda --ranks 8 --tokens 400000 --hidden 7168 \
        --ffn-hidden 2048 --experts 256 --top-k 8
      expect_refusal cli-gpu-memory-1 "of GPU memory" "$bin/tilemoe" run --backend cuda --ranks 1 --tokens 2000000 --hidden 7168 \
        --ffn-hidden 2048 --experts 256 --top-k 8
      run_step cli-sampled "$bin/tilemoe" run --backend cuda --ranks 4 --tokens 4096 --hidden 4096 --ffn-hidden 8192 --experts 8 \
        --top-k 2 --strategy tile_signal ;;
    cli-ep)
      run_step cli-ep "$bin/tilemoe" run --backend cuda --ranks 4
      run_step cli-ep-partitions "$bin/tilemoe" run --backend cuda --ranks 4 --sms-per-rank 32 --link-gbps 50
      run_step cli-ep-host "$bin/tilemoe" run --backend cuda --ranks 8 --tokens 128 --hidden 512 --ffn-hidden 512 --experts 32 --top-k 8 --dispatch host
      run_step cli-ep-row-per-expert "$bin/tilemoe" run --backend cuda --ranks 8 --tokens 200 --hidden 512 --ffn-hidden 512 --experts 32 \
        --top-k 8 --dispatch-volume row-per-expert --strategy tile_signal
      run_step cli-ep-capacity "$bin/tilemoe" run --backend cuda --ranks 4 --capacity-factor 1.0 --routing skewed --strategy tile_signal
      expect_refusal cli-ep-host-once "row-per-expert" "$bin/tilemoe" run --backend cuda --ranks 2 --tokens 64 --dispatch host \
        --dispatch-volume once-per-rank
      expect_timeout cli-ep-silent "rank 1 stalled" "$bin/tilemoe" run --backend cuda --ranks 4 --silent-rank 1 --timeout-ms 2000 ;;
    comet)  # comet on the GPU (the dispatch beside GEMM0, GEMM1 in column splits): the CLI against sequential,
      # a silent rank, then the layer against sequential and tile_signal on SM partitions with emulated links
      run_step cli-comet "$bin/tilemoe" run --backend cuda --ranks 4 --strategy comet
      run_step cli-comet-partitions "$bin/tilemoe" run --backend cuda --ranks 4 --sms-per-rank 32 --link-gbps 50 --strategy comet \
        --tokens 2048 --hidden 2048 --ffn-hidden 1024 --experts 32 --top-k 8
      expect_timeout cli-comet-silent "rank 1 stalled" "$bin/tilemoe" run --backend cuda --ranks 4 --silent-rank 1 --timeout-ms 2000 \
        --strategy comet
      case_args=()
      for c in ${COMET_CASES:-deepseek-v3:4096:8 mixtral-8x7b:4096:8}; do case_args+=(--case "$c"); done
      run_step comet-layer "$bin/tile_signal_bench" --quick "${case_args[@]}" --json "$out/comet_layer.json" --trace "$traces/comet_trace" ;;
    dispatch-volume)  # a token once per destination rank against a row per expert, in the same runs: the layer's
      # sequential rows of tile_signal_bench (SM partitions, emulated links) and the exchange alone
      case_args=()
      for c in ${DV_LAYER_CASES:-deepseek-v3:4096:8 mixtral-8x7b:4096:8}; do case_args+=(--case "$c"); done
      run_step dispatch-volume-layer "$bin/tile_signal_bench" --quick "${case_args[@]}" --json "$out/dispatch_volume_layer.json"
      run_step dispatch-volume-exchange "$bin/ep_exchange_bench" --quick --json "$out/dispatch_volume_exchange.json"
      run_step dispatch-volume-exchange-link "$bin/ep_exchange_bench" --quick --sms-per-rank 16 --link-gbps 45 \
        --json "$out/dispatch_volume_exchange_link.json" ;;
    nccl)
      { echo "PyTorch's NCCL: $nccl_lib"; ls -l "$nccl_lib"; echo "ldconfig's: $system_nccl"; ls -l /usr/local/cuda/lib/libnccl* 2>&1; } >>"$log"
      run_step nccl-launch env LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" "$bin/tilemoe" launch -n 1 -- \
        "$bin/tilemoe" run --backend cuda --transport nccl --ranks 1
      run_step nccl-launch-host env LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" "$bin/tilemoe" launch -n 1 -- \
        "$bin/tilemoe" run --backend cuda --transport nccl --ranks 1 --dispatch host --tokens 300 --experts 16 --top-k 4
      run_step nccl-mpirun env LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" mpirun --allow-run-as-root -np 1 -x LD_LIBRARY_PATH \
        -x NCCL_NVLS_ENABLE "$bin/tilemoe" run --backend cuda --transport nccl --ranks 1 --tokens 256 --hidden 1024 \
        --ffn-hidden 1024 --experts 16 --top-k 4
      [ -n "$system_nccl" ] && expect_refusal nccl-version "compiled against NCCL" env LD_LIBRARY_PATH="$(dirname "$system_nccl")" \
        "$bin/tilemoe" run --backend cuda --transport nccl --ranks 1
      expect_refusal nccl-multicast "NCCL_NVLS_ENABLE=1" env NCCL_NVLS_ENABLE=1 LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" \
        "$bin/tilemoe" run --backend cuda --transport nccl --ranks 1
      expect_refusal nccl-world-size "started 1 process" env LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" \
        "$bin/tilemoe" run --backend cuda --transport nccl --ranks 2 ;;
    multi)  # real ranks, one process per GPU of this machine (the multi-GPU kinds)
      gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
      if [ "$gpus" -lt 2 ]; then
        echo "== multi: $gpus GPU(s), skipped" | tee -a "$log"
      else
        nccl_env=(env LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH")
        run_step multi-run "${nccl_env[@]}" "$bin/tilemoe" launch -n "$gpus" -- "$bin/tilemoe" run --backend cuda --transport nccl \
          --ranks "$gpus" --tokens 512 --hidden 1024 --ffn-hidden 2048 --experts $((gpus * 4)) --top-k 4
        run_step multi-run-host "${nccl_env[@]}" "$bin/tilemoe" launch -n "$gpus" -- "$bin/tilemoe" run --backend cuda \
          --transport nccl --ranks "$gpus" --tokens 512 --hidden 1024 --ffn-hidden 2048 --experts $((gpus * 4)) --top-k 4 --dispatch host
        run_step multi-run-tile "${nccl_env[@]}" "$bin/tilemoe" launch -n "$gpus" -- "$bin/tilemoe" run --backend cuda \
          --transport nccl --ranks "$gpus" --tokens 512 --hidden 1024 --ffn-hidden 2048 --experts $((gpus * 4)) --top-k 4 \
          --strategy tile_signal
        expect_timeout multi-silent "rank 1 stalled" "${nccl_env[@]}" "$bin/tilemoe" launch -n "$gpus" -- "$bin/tilemoe" run \
          --backend cuda --transport nccl --ranks "$gpus" --experts $((gpus * 4)) --silent-rank 1 --timeout-ms 5000
        run_step multi-mpirun "${nccl_env[@]}" mpirun --allow-run-as-root -np "$gpus" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE \
          "$bin/tilemoe" run --backend cuda --transport nccl --ranks "$gpus" --experts $((gpus * 2))
        run_step multi-ep-bench "${nccl_env[@]}" "$bin/tilemoe" launch -n "$gpus" -- "$bin/ep_exchange_bench" --transport nccl \
          --json "$out/ep_bench_nccl.json"
        run_step multi-torch env PYTHONUNBUFFERED=1 python3 -m torch.distributed.run --nproc-per-node "$gpus" \
          bench/torch_ep_reference.py --json "$out/torch_ep.json"
      fi ;;
    multi-ts)  # the layer with real ranks: sequential vs tile_signal (auto and the sweep), a whole GPU per rank
      gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
      if [ "$gpus" -lt 2 ]; then
        echo "== multi-ts: $gpus GPU(s), skipped" | tee -a "$log"
      else
        run_step multi-ts-bench env LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH" "$bin/tilemoe" launch -n "$gpus" -- \
          "$bin/tile_signal_bench" --transport nccl --json "$out/ts_bench_nccl.json" --trace "$traces/ts_nccl_trace"
      fi ;;
    cli-bench) run_step cli-bench "$bin/tilemoe" bench --backend cuda --ranks 1 --tokens 4096 --hidden 4096 --ffn-hidden 14336 --experts 8 --top-k 2 --runs 20 ;;
    torch) run_step torch env PYTHONUNBUFFERED=1 python3 bench/torch_reference.py --json "$out/torch.json" ;;
    transformers)  # tilemoe (CPU engine, and the GPU where its router runs the rule) against Hugging Face
      # transformers' own MoE modules on fresh random data; each CLI call is bounded inside, the whole
      # script here (a TERM still writes the summary)
      run_step transformers env PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 timeout 240 python3 scripts/device/transformers_check.py \
        --tilemoe "$bin/tilemoe" --json "$out/transformers.json" ;;
    model-fixtures)  # the checked-in model fixtures (tests/fixtures/models) rerun by this machine's transformers,
      # so that they cannot go stale; then those the GPU runs through its router (mixtral, qwen3, and with their
      # shared experts qwen2, deepseek-v3 and llama-4, gpt-oss with its biases; the GPU stores bf16, so the fp32 models
      # run rounded to bf16)
      run_step model-fixtures env PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 timeout 120 python3 scripts/make_model_fixtures.py \
        --check tests/fixtures/models
      for fixture in mixtral_fp32:1 mixtral_bf16_sharded:2 qwen3_moe_bf16_fused:0 qwen2_moe_fp32:1 deepseek_v3_bf16:1 deepseek_v3_fp32:2 llama4_bf16:2 llama4_multimodal_bf16:1 gpt_oss_bf16:0 gpt_oss_fp32:1; do
        run_step "model-gpu-${fixture%%:*}" timeout 60 "$bin/tilemoe" run --backend cuda --ranks 2 --model "tests/fixtures/models/${fixture%%:*}" \
          --layer "${fixture##*:}" --inputs "tests/fixtures/models/${fixture%%:*}/block_case.safetensors" --dtype bf16
      done ;;
    targets)  # the target cases, PyTorch then tilemoe in one call (then DeepSeek-V3 16384, which a cut call lost)
      run_step torch-targets env PYTHONUNBUFFERED=1 timeout 200 python3 bench/torch_reference.py "${target_cases[@]}" \
        --case deepseek-v3:16384 --json "$out/torch_targets.json"
      run_step bench-targets "$bin/cuda_layer_bench" "${target_cases[@]}" --stall-limit-s 30 --json "$out/bench_targets.json"
      run_step bench-ds16k timeout 300 "$bin/cuda_layer_bench" --case deepseek-v3:16384 --stall-limit-s 30 --json "$out/bench_ds16k.json" ;;
    torch-quick) run_step torch env PYTHONUNBUFFERED=1 python3 bench/torch_reference.py --quick --json "$out/torch.json" ;;
    *) echo "unknown step $step" | tee -a "$log"; status=1 ;;
  esac
done
grep -E "FAIL|SKIP|passed|failure|ERROR SUMMARY|measured rates|stalled|STALL|launches finished" "$log" | tail -n 40
exit $status
