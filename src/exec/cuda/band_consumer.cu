#include "band_consumer.hpp"

#include "comm/cuda/device_sync.cuh"
#include "row_copy.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kConsumerThreads = 512;

__global__ void __launch_bounds__(kConsumerThreads) consumer_kernel(DeviceTransport t, BandConsumerArgs a) {
  const EpExchangeArgs& x = a.exchange;
  const int me = t.rank, tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32, warps = kConsumerThreads / 32;
  const std::uint64_t epoch = *x.tables.epoch;
  const int row_bytes = x.hidden * 2;
  const PlanTables& plan = *a.plan;
  __shared__ int s_ok;
  if (tid == 0) s_ok = !x.silent && !transport_failed(t);
  __syncthreads();
  const int segments = max(static_cast<int>(plan.segments.count) - a.first_segment, 0);
  const int per = a.segments_per_unit;
  const int units = (segments + per - 1) / per;
  for (int u = static_cast<int>(blockIdx.x); u < units; u += static_cast<int>(gridDim.x)) {
    const int first = a.first_segment + u * per, here = min(per, segments - u * per);
    if (a.unit_times != nullptr && tid == 0) a.unit_times[3 * u] = global_timer_ns();
    const Segment& head = plan.segments.data[first];  // the unit's segments share these waits
    for (int i = tid; i < static_cast<int>(head.wait_count); i += kConsumerThreads) {
      const FlagWait w = plan.waits.data[head.wait_begin + i];
      if (!wait_tile_flag(t, a.flags + (static_cast<int>(w.flag) - a.flag_offset), w.expected, epoch)) s_ok = 0;
    }
    __syncthreads();  // extends the flags' acquire to the CTA
    const bool ok = s_ok != 0;
    __syncthreads();  // all have read s_ok before the next unit's waits may clear it
    if (!ok) break;
    if (a.unit_times != nullptr && tid == 0) a.unit_times[3 * u + 1] = global_timer_ns();
    // the unit's rows, a warp per row, each to its destination's returned rows; with link
    // emulation every warp paces its remote rows to its share of the rank's link (all consumer
    // warps together, from the unit's start: conservative when few are busy). After its rows, the
    // warp raises their arrival flags at their destinations, up to 32 at once (a lane per row,
    // each a release after the warp's barrier: one fence for 32 rows)
    const bool paced = t.link_bytes_per_ns > 0.0;
    const std::uint64_t copy_start = paced ? global_timer_ns() : 0;
    double sent = 0;
    int pending = 0, flag_rank = 0, flag_row = 0;  // pending is the same on all lanes
    auto raise_pending = [&] {
      __syncwarp();  // the warp's row stores are ordered before each lane's release
      if (lane < pending) store_release(region_at<std::uint64_t>(t, flag_rank, x.layout.row_arrivals) + flag_row, epoch);
      pending = 0;
    };
    for (int j = 0; j < here; ++j) {
      const Segment s = plan.segments.data[first + j];
      const int q = s.dest_rank;
      for (int r = warp; r < static_cast<int>(s.rows); r += warps) {
        const int dest = static_cast<int>(s.dst_row) + r;
        copy_row(region_at<std::byte>(t, q, x.layout.returned_rows) + static_cast<std::size_t>(dest) * row_bytes,
                 x.expert_out + static_cast<std::size_t>(s.src_row + r) * row_bytes, row_bytes, lane);
        if (lane == pending) {
          flag_rank = q;
          flag_row = dest;
        }
        if (++pending == 32) raise_pending();
        if (paced && q != me) {
          sent += row_bytes;
          if (lane == 0) pace_link(t, copy_start, sent, 1.0 / (static_cast<double>(gridDim.x) * warps));
          __syncwarp();
        }
      }
    }
    if (pending > 0) raise_pending();
    __syncthreads();
    if (a.unit_times != nullptr && tid == 0) a.unit_times[3 * u + 2] = global_timer_ns();
  }
}

}  // namespace

void launch_band_consumer(cudaStream_t stream, const DeviceTransport& t, const BandConsumerArgs& a) {
  if (a.ctas < 1 || a.segments_per_unit < 1 || a.plan == nullptr || a.flags == nullptr || a.first_segment < 0) {
    throw_internal("band consumer: bad arguments");
  }
  if (a.ctas % 2 != 0) throw_internal("band consumer: it launches clusters of 2 CTAs");
  // Clusters of 2, like GEMM1's: a lone consumer CTA on each of several SM pairs would leave
  // single free SMs where no GEMM cluster fits, and the GEMM clusters that do not fit would
  // run as a second wave (measured: GEMM1 twice as long at 4 and 8 loose consumer CTAs)
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(a.ctas));
  config.blockDim = dim3(kConsumerThreads);
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  TILEMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, consumer_kernel, t, a));
  TILEMOE_CUDA_CHECK_LAUNCH("band consumer");
}

}  // namespace tilemoe::cuda
