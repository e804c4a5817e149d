#include "plan_combine.hpp"

#include "comm/cuda/device_sync.cuh"
#include "comm/cuda/gin_transport.cuh"
#include "kernels/combine_vector.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kPlanCombineThreads = 256;

__global__ void __launch_bounds__(kPlanCombineThreads) plan_combine_kernel(DeviceTransport t, PlanCombineArgs a) {
  const PlanTables& plan = *a.plan;
  const std::uint64_t epoch = *a.epoch;
  const int me = t.rank, tid = static_cast<int>(threadIdx.x), k = a.top_k;
  const auto* rows = region_at<__nv_bfloat16>(t, me, a.layout.returned_rows);
  const std::uint64_t* counters = region_at<std::uint64_t>(t, me, a.layout.segment_flags);
  // a failing step combines nothing (every thread reaches the same verdict by the barrier's or)
  if (__syncthreads_or(tid == 0 && (transport_failed(t) || plan.header.overflow != 0))) return;
  const auto invalid = [&](std::uint64_t what) {
    record_failure(t, comm::WaitState::PlanInvalid, me, comm::WaitSubject::CombineRows, what, 0, 0, epoch);
  };
  for (std::uint32_t i = blockIdx.x; i < plan.combines.count; i += gridDim.x) {
    const CombineTask task = plan.combines.data[i];
    const bool fits = task.wait_begin + static_cast<std::uint64_t>(task.wait_count) <= plan.waits.count && task.token_begin >= 0 &&
                      task.token_end <= a.tokens && task.col_begin >= 0 && task.col_end <= a.hidden && task.col_begin % 8 == 0 &&
                      task.col_end % 8 == 0;
    if (!fits) {
      if (tid == 0) invalid(plan.segments.count + i);
      return;
    }
    int failed = 0;
    for (std::uint32_t w = static_cast<std::uint32_t>(tid); w < task.wait_count; w += kPlanCombineThreads) {
      const FlagWait fw = plan.waits.data[task.wait_begin + w];
      if (fw.flag >= static_cast<std::uint32_t>(a.layout.segment_flag_count) || fw.from_rank < 0 || fw.from_rank >= t.world) {
        invalid(plan.segments.count + i);
        failed = 1;
      } else if (!wait_peer(t, counters + fw.flag, kGinSegmentFlagSignal + fw.flag,
                            epoch * fw.expected * static_cast<std::uint64_t>(a.signals_per_count), fw.from_rank,
                            comm::WaitSubject::CombineRows, epoch)) {
        failed = 1;
      }
    }
    if (__syncthreads_or(failed)) return;  // the barrier also extends the flags' acquire to the CTA
    const int first = static_cast<int>(task.col_begin / 8), vectors = static_cast<int>((task.col_end - task.col_begin) / 8);
    const std::int64_t work = (task.token_end - task.token_begin) * vectors;
    for (std::int64_t x = tid; x < work; x += kPlanCombineThreads) {
      const int token = static_cast<int>(task.token_begin + x / vectors), v = first + static_cast<int>(x % vectors);
      reinterpret_cast<uint4*>(a.output + static_cast<std::size_t>(token) * a.hidden)[v] =
          combine_vector(rows, a.weight, a.row_of_slot, token, k, a.hidden, v);
    }
  }
}

}  // namespace

int plan_combine_ctas_per_sm() {
  int blocks = 0;
  TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, plan_combine_kernel, kPlanCombineThreads, 0));
  return blocks;
}

void launch_plan_combine(cudaStream_t stream, const DeviceTransport& t, const PlanCombineArgs& a) {
  if (a.tokens == 0) return;
  if (a.plan == nullptr || a.epoch == nullptr || a.ctas < 1 || a.top_k < 1 || a.hidden % 8 != 0 || a.signals_per_count < 1) {
    throw_internal("plan combine: bad arguments");
  }
  plan_combine_kernel<<<a.ctas, kPlanCombineThreads, 0, stream>>>(t, a);
  TILEMOE_CUDA_CHECK_LAUNCH("plan combine");
}

}  // namespace tilemoe::cuda
