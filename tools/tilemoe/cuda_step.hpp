#pragma once
// `tilemoe run --backend cuda`: the step on the GPU, through cuda::MoeLayer for one rank and
// cuda::EpMoeLayer on virtual ranks (all ranks on this process's GPU) for more.
#include <vector>

#include "step_options.hpp"
#include "tilemoe/strategy_options.hpp"
#include "tilemoe/trace.hpp"

namespace tilemoe::cli {

struct CudaStepOptions {
  // multi-rank: virtual (all ranks in this process, on its GPU) or nccl (this process is one
  // rank of a world started by a launcher: tilemoe launch, mpirun, srun)
  std::string transport = "virtual";
  std::string dispatch = "device";  // multi-rank: device (device-API kernels) or host (host-API all-to-all)
  std::string strategy = "sequential";  // multi-rank: sequential, tile_signal, comet or auto
  TileSignalOptions tile_signal;        // the knobs of tile_signal (--mgb), as on the CPU engine
  CometOptions comet;                   // the knobs of comet (--comet-split)
  double link_gbps = 0.0;           // virtual ranks: emulated outgoing link per rank, GB/s (0 = unpaced)
  int sms_per_rank = 0;             // virtual ranks: an SM partition of this many SMs each (0 = share the GPU)
  std::int64_t timeout_ms = 30000;  // bound of every device and host wait
  bool trace = false;               // multi-rank: record device timestamps of the timed step
  int silent_rank = -1;             // fault injection (tests): this rank's exchange kernels send nothing
  std::optional<DispatchVolume> dispatch_volume;  // multi-rank: --dispatch-volume if given (else the layer's default)
};

struct CudaStepOutput {
  std::vector<Matrix> outputs;   // per rank
  std::vector<Routing> routing;  // the routing the GPU chose, to check the expert path on it
  double forward_ms = 0.0;       // one forward after a warm-up, CUDA events (the slowest rank)
  std::string description;       // how it ran: "1 rank" / "4 virtual ranks, device dispatch, ..."
  bool quiet = false;            // a rank other than 0 of a multi-process world: rank 0 reports
  std::vector<DeviceSpan> spans; // with CudaStepOptions::trace: this process's ranks' device spans
  // an overlap strategy is also run as sequential on the same inputs: per rank of this process
  // 1 if the outputs are bitwise equal, 0 if not, -1 if not compared
  std::vector<int> matches_sequential;
};

// Refuses (bad input, exit 2) a step whose layers would not fit the free memory of this
// process's GPU, naming the bytes it needs and what they are; before any data is made.
// `shared_ffn_hidden`: the width of the layer's shared expert, 0: none.
void check_gpu_memory(const EpWorld& world, const CudaStepOptions& options, std::int64_t shared_ffn_hidden = 0);

CudaStepOutput run_cuda_step(const PreparedStep& step, const CudaStepOptions& options);

// `tilemoe bench --backend cuda`: per-stage medians of the one-GPU forward of `world` (one
// rank) on synthetic logits of `pattern`, weights drawn on the device.
struct CudaBenchResult {
  double stage_ms[7] = {};
  const char* stage_names[7] = {};
  double total_ms = 0.0;
};
CudaBenchResult run_cuda_bench(const EpWorld& world, RoutingPattern pattern, std::uint64_t seed, int runs);

}  // namespace tilemoe::cli
