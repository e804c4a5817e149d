#pragma once
// The planned grouped GEMM kernel (planned_gemm.hpp says what it computes). Include from exactly
// one .cu per (cluster, epilogue) instantiation: about a minute of compile time each.
//
// One CTA = 3 warp groups (384 threads), one CTA per SM, persistent:
//   warp group 0, warp 0: the loader. For each of its entries it points the CTA's TMA
//       descriptors at the entry's group (only when the group changes: a descriptor rewrite
//       costs a few hundred cycles) and streams the K tiles of A and B into the smem pipeline
//       with CUTLASS's collective mainloop (TMA, multicast across the cluster).
//   warp groups 1 and 2: the MMA threads. Both work on one 128 x 256 tile (64 rows each), then
//       run the epilogue: activation in fp32 on the accumulators, one bf16 rounding, staging in
//       smem, 16-byte stores of the entry's real rows, a barrier over the 256 threads, and one
//       thread's release add on the entry's flag.
// Entries are read straight from the table (or the plan's tiles) in global memory by both roles
// (a 20- or 56-byte load per tile), so no scheduler warp and no smem pipeline of work tiles is
// needed. Which item a cluster runs next is either a fixed stride (static fetch) or claimed from
// a device counter by the loader of the cluster's rank-0 CTA and passed to every reader through
// a ring of smem slots (dynamic fetch; PlannedItemRing).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#pragma nv_diag_suppress 2908
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/util/packed_stride.hpp"
#pragma nv_diag_default 2908
#include "comm/cuda/device_sync.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "kernels/gemm/planned/planned_gemm_backend.hpp"
#include "kernels/gemm/planned/planned_gemm_probe.hpp"
#include "tilemoe/error.hpp"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "compile the planned GEMM for sm_90a (-gencode arch=compute_90a,code=sm_90a), not sm_90"
#endif

namespace tilemoe::cuda::detail {

// The output columns of one staging pass: SwiGLU halves the tile to 128 columns (one pass);
// the other epilogues stage 128 of the 256 columns at a time (two passes), which keeps the
// staging buffer at 34 KB and the mainloop at four 48 KB stages.
constexpr int kStageCols = 128;
constexpr int kStagePitch = kStageCols + 8;  // +16 bytes per row: conflict-free smem writes
constexpr int kStageBytes = kPlannedTileM * kStagePitch * 2;

// The dynamic fetch's hand-off. The claimer (the loader warp of the cluster's rank-0 CTA, lane
// 0) claims item number seq of its cluster's sequence and posts it into slot seq % kItemRing of
// every CTA of the cluster (a DSMEM store, then a release arrive on that CTA's `full`). The
// readers, the 8 MMA warps of each CTA and the loader warps of the other CTAs, each wait on
// their own `full`, read the slot and free it with one arrive on rank 0's `empty`. The end of
// the sequence is posted as -1 and never freed (nothing is posted after it). Eight slots let
// the loaders run a pipeline's worth of one-K-tile items ahead of the MMA warps.
constexpr int kItemRing = 8;
struct PlannedItemRing {
  alignas(8) uint64_t full[kItemRing];  // every CTA: one arrival (the claimer's) per post
  uint64_t empty[kItemRing];            // rank 0 only: one arrival per reader per item
  int item[kItemRing];
};

__device__ __forceinline__ void planned_ring_wait(const uint64_t* barrier, uint32_t parity) {
  const uint32_t addr = cute::cast_smem_ptr_to_uint(barrier);
  // acquire at cluster scope: the slot was written (or last read) by another CTA of the cluster
  asm volatile(
      "{\n\t.reg .pred done;\n\t"
      "ring_wait:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra ring_wait;\n\t}" ::"r"(addr),
      "r"(parity)
      : "memory");
}

// The claimer: waits until every reader freed the slot's previous item, claims the next item
// (-1 once the table is exhausted) and posts it to every CTA of the cluster.
template <int kClusterSize>
__device__ __forceinline__ int planned_ring_claim(PlannedItemRing& ring, int seq, int* counter, int items) {
  const int slot = seq % kItemRing;
  planned_ring_wait(&ring.empty[slot], uint32_t(((seq / kItemRing) & 1) ^ 1));
  int item = atomicAdd(counter, 1);
  if (item >= items) item = -1;
  const uint32_t item_addr = cute::cast_smem_ptr_to_uint(&ring.item[slot]);
  const uint32_t full_addr = cute::cast_smem_ptr_to_uint(&ring.full[slot]);
  CUTLASS_PRAGMA_UNROLL
  for (uint32_t rank = 0; rank < uint32_t(kClusterSize); ++rank) {
    asm volatile(
        "{\n\t.reg .b32 item_remote, full_remote;\n\t"
        "mapa.shared::cluster.u32 item_remote, %0, %2;\n\t"
        "mapa.shared::cluster.u32 full_remote, %1, %2;\n\t"
        "st.shared::cluster.s32 [item_remote], %3;\n\t"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [full_remote];\n\t}" ::"r"(item_addr),
        "r"(full_addr), "r"(rank), "r"(item)
        : "memory");
  }
  return item;
}

// A reader warp: item number seq of the cluster's sequence, the same in every lane.
__device__ __forceinline__ int planned_ring_read(PlannedItemRing& ring, int seq, int lane) {
  int item = 0;
  if (lane == 0) {
    const int slot = seq % kItemRing;
    planned_ring_wait(&ring.full[slot], uint32_t((seq / kItemRing) & 1));
    item = *reinterpret_cast<volatile int*>(&ring.item[slot]);
    if (item >= 0) {
      const uint32_t empty_addr = cute::cast_smem_ptr_to_uint(&ring.empty[slot]);
      asm volatile(
          "{\n\t.reg .b32 empty_remote;\n\t"
          "mapa.shared::cluster.u32 empty_remote, %0, %1;\n\t"
          "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [empty_remote];\n\t}" ::"r"(empty_addr),
          "r"(0u)
          : "memory");
    }
  }
  return __shfl_sync(0xffffffffu, item, 0);
}

template <class ClusterShape_>
struct PlannedGemmTypes {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = ClusterShape_;
  using Element = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  // Room left for the kernel's own smem: staging buffer, descriptors, barriers.
  static constexpr int kCarveout = kStageBytes + 512;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, 8, Element, LayoutB*, 8, float,
      TileShape, ClusterShape, cutlass::gemm::collective::StageCountAutoCarveout<kCarveout>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Stride = cute::remove_pointer_t<typename Mainloop::StrideA>;
  static_assert(std::is_same_v<Stride, cute::remove_pointer_t<typename Mainloop::StrideB>>);
  static_assert(std::is_same_v<Stride, cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>>);
  static constexpr int kClusterM = cute::size<0>(ClusterShape{});
  static constexpr int kClusterN = cute::size<1>(ClusterShape{});
  static constexpr int kClusterSize = kClusterM * kClusterN;
  static_assert(kClusterSize == kPlannedClusterSize && cute::size<2>(TileShape{}) == kPlannedTileK,
                "planned_gemm.hpp's tile and cluster constants describe this kernel");
  static_assert(Mainloop::DispatchPolicy::Stages >= 4, "the planned GEMM expects four pipeline stages");

  struct SharedStorage {
    alignas(128) typename Mainloop::TensorStorage mainloop;
    alignas(128) typename Mainloop::TensorMapStorage tensormaps;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) __nv_bfloat16 stage[kPlannedTileM * kStagePitch];
    PlannedItemRing ring;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  // The carveout above must cover the kernel's own storage: the builder sized the pipeline from it.
  static_assert(kSmemBytes <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the planned GEMM's shared memory exceeds the SM's");
  // Readers of each ring slot: the 8 MMA warps of every CTA and the other CTAs' loader warps.
  static constexpr int kRingReaders = kClusterSize * 8 + (kClusterSize - 1);

  struct Params {
    typename Mainloop::Params mainloop;
    const GemmTileEntry* table;
    const int* count;
    const PlanTables* plan;  // instead of table and count (PlannedGemmRun::plan)
    int plan_layer;
    int a_rows, N, K, n_out;
    __nv_bfloat16* D;
    unsigned* flags;
    int flag_offset;
    unsigned long long* tile_times;
    PaddingMma padding_mma;  // resolved on the host: never Default
    int* item_counter;       // dynamic fetch: zeroed by the setup kernel; nullptr: static fetch
    PlannedProbeRecord* probe;  // optional [grid CTAs][kProbeRoles], cluster-major (planned_gemm_probe.hpp)
    const float* bias;          // optional [groups][N], added to the fp32 sums before the activation
    SwigluVariant swiglu;       // the SwiGLU epilogue's
    bool plain_swiglu;          // swiglu is the default: silu(gate) * up
    PlannedTileWaits tile_waits;
  };
};

// silu with the fast intrinsics (ex2 and rcp on the special-function unit, ~2 ulp in fp32, far
// below the one bf16 rounding that follows): the IEEE expf and division cost about 20
// instructions per element, which made SwiGLU's epilogue ~3% of a K = 4096 tile's time. For
// x < -88, e^-x is inf and x * rcp(inf) = -0, the limit.
__device__ __forceinline__ float planned_silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }
__device__ __forceinline__ float planned_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
// GPT-OSS's SwiGLU (SwigluVariant, as the CPU's clamped_swiglu): the gate clamped from above and
// the up value both ways, gate * sigmoid(alpha * gate), times up plus its offset.
__device__ __forceinline__ float planned_clamped_swiglu(const SwigluVariant& v, float gate, float up) {
  if (v.limit > 0.0f) {
    gate = fminf(gate, v.limit);
    up = fminf(fmaxf(up, -v.limit), v.limit);
  }
  return (up + v.up_offset) * (gate * (1.0f / (1.0f + expf(-(v.alpha * gate)))));
}

// A barrier over the 256 MMA threads (hardware barrier 8: CUTLASS reserves 0-7). Unlike
// cutlass::arch::NamedBarrier, the asm carries a memory clobber, so the compiler cannot move
// the staging buffer's ordinary smem loads and stores across it.
__device__ __forceinline__ void planned_epilogue_barrier() {
  asm volatile("bar.sync 8, 256;" ::: "memory");
}

// One role's probe record (planned_gemm_probe.hpp): volatile stores, so a host reading mapped
// memory sees each step as it is taken, not when the kernel ends.
template <class State>
__device__ __forceinline__ void planned_probe(PlannedProbeRecord* record, ProbeStep step, int seq, int item,
                                              const State& state, int k, int rows) {
  if (record == nullptr) return;
  int* p = reinterpret_cast<int*>(record);
  asm volatile("st.volatile.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(int(step)), "r"(seq), "r"(item),
               "r"(int(state.count()))
               : "memory");
  asm volatile("st.volatile.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p + 4), "r"(state.index()), "r"(int(state.phase())),
               "r"(k), "r"(rows)
               : "memory");
}

// Only the step of a probe record: the record keeps the role's last pipeline position.
__device__ __forceinline__ void planned_probe_step(PlannedProbeRecord* record, ProbeStep step) {
  if (record == nullptr) return;
  asm volatile("st.volatile.s32 [%0], %1;" ::"l"(reinterpret_cast<int*>(record)), "r"(int(step)) : "memory");
}

__device__ __forceinline__ unsigned long long planned_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The loader warp, before it loads plan tile `tile`'s rows: each lane waits for some of the
// tile's waits on counters (PlannedTileWaits), the warp meets, and every lane fences the async
// proxy, so that the TMA loads the warp issues next read what the acquires saw.
__device__ __forceinline__ void planned_wait_for_tile(const PlannedTileWaits& w, const PlanTables& plan, const GemmTile& tile, int lane) {
  const std::uint64_t epoch = *w.epoch;
  for (std::uint32_t i = std::uint32_t(lane); i < tile.wait_count; i += 32) {
    if (tile.wait_begin + std::uint64_t(i) >= plan.waits.count) {  // a compiler's bug: recorded, never read past the table
      record_failure(w.transport, comm::WaitState::PlanInvalid, w.transport.rank, comm::WaitSubject::DispatchRows,
                     tile.wait_begin + std::uint64_t(i), 0, 0, epoch);
      continue;
    }
    const FlagWait fw = plan.waits.data[tile.wait_begin + i];
    if (fw.flag >= w.counter_flags) continue;  // a GEMM's own flag: met by stream order
    const std::uint64_t* counter = region_at<const std::uint64_t>(w.transport, w.transport.rank, w.counters) + fw.flag;
    wait_at_least(w.transport, counter, epoch * fw.expected * w.signals_per_count, fw.from_rank, comm::WaitSubject::DispatchRows, epoch);
  }
  __syncwarp();
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Table entry `index`: the table's, or the plan tile's in the table's terms (PlannedGemmRun::plan).
template <int kOutTileCols>
__device__ __forceinline__ GemmTileEntry planned_entry(const GemmTileEntry* table, const GemmTile* plan_tiles, int index) {
  return plan_tiles == nullptr ? table[index] : entry_of_tile(plan_tiles[index], kOutTileCols);
}

template <class Types, PlannedEpilogue kEpilogue>
__global__ void __launch_bounds__(384, 1) planned_gemm_kernel(const __grid_constant__ typename Types::Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using X = Underscore;
  using Mainloop = typename Types::Mainloop;
  using TileShape = typename Types::TileShape;
  using ClusterShape = typename Types::ClusterShape;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using TiledMma = typename Mainloop::TiledMma;
  constexpr int kMmaThreads = 256;
  static_assert(size(TiledMma{}) == kMmaThreads);
  // The cooperative tile: warp group w (of the two MMA groups) computes rows [64 w, 64 w + 64),
  // as the collective slices it (thread 128 w of the TiledMma, atoms stacked along M).
  constexpr int kRowsPerWarpGroup = kPlannedTileM / 2;
  static_assert(cute::size<1>(typename TiledMma::ThrLayoutVMNK{}) == 2 && cute::size<2>(typename TiledMma::ThrLayoutVMNK{}) == 1,
                "the planned GEMM expects two MMA warp groups stacked along M");

  extern __shared__ __align__(128) char smem_raw[];
  auto& smem = *reinterpret_cast<typename Types::SharedStorage*>(smem_raw);
  // output columns per tile: SwiGLU's epilogue halves the GEMM's 256 (gate/up pairs)
  constexpr int kOutTileCols = kEpilogue == PlannedEpilogue::SwiGLU ? kPlannedTileN / 2 : kPlannedTileN;

  const int thread = int(threadIdx.x);
  const int warp_group = thread / 128;
  const int warp_in_group = (thread / 32) % 4;
  const int lane = thread % 32;
  const uint32_t rank_in_cluster = cute::block_rank_in_cluster();
  const int cluster_id = int(blockIdx.x) / Types::kClusterM;
  const int clusters = int(gridDim.x) / Types::kClusterM;
  const int sm_idx = int(blockIdx.x + blockIdx.y * gridDim.x);
  const int sm_count = int(gridDim.x * gridDim.y);

  const bool dynamic = params.item_counter != nullptr;
  if (dynamic && thread == 0) {
    for (int slot = 0; slot < kItemRing; ++slot) {
      cutlass::arch::ClusterBarrier::init(&smem.ring.full[slot], 1);
      cutlass::arch::ClusterBarrier::init(&smem.ring.empty[slot], Types::kRingReaders);
    }
    cutlass::arch::fence_barrier_init();
  }

  typename Pipeline::Params pipe_params;
  if (warp_group == 0 && warp_in_group == 0) pipe_params.role = Pipeline::ThreadCategory::Producer;
  if (warp_group > 0) pipe_params.role = Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = (thread % 128) == 0;
  pipe_params.num_consumers = kMmaThreads;
  pipe_params.num_producers = Mainloop::NumProducerThreadEvents;
  pipe_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
  Pipeline pipeline(smem.pipeline, pipe_params, ClusterShape{});

  // The pipeline and ring barriers of every CTA of the cluster must be initialised before any
  // TMA multicast or remote arrive touches them.
  if constexpr (Types::kClusterSize > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  // The entries: the table's, or this GEMM's range of the plan's tiles.
  const GemmTile* plan_tiles = nullptr;
  int entries = 0;
  if (params.plan != nullptr) {
    const PlanHeader& header = params.plan->header;
    entries = header.overflow != 0 ? 0 : int(header.layer_tiles[params.plan_layer]);
    plan_tiles = params.plan->tiles.data + (params.plan_layer == 0 ? 0u : header.layer_tiles[0]);
  } else {
    entries = *params.count;
  }
  const auto entry_at = [&](int index) { return planned_entry<kOutTileCols>(params.table, plan_tiles, index); };
  const int items = entries > 0 ? entries / Types::kClusterSize : 0;
  const int k_tiles = (params.K + int(size<2>(TileShape{})) - 1) / int(size<2>(TileShape{}));
  Mainloop mainloop;

  // Item number seq of this cluster's sequence (-1: no more) for the static fetch.
  const auto static_item = [&](int seq) {
    const int item = cluster_id + seq * clusters;
    return item < items ? item : -1;
  };
  const bool claimer = dynamic && rank_in_cluster == 0;
  // This role's probe record, written by one thread of the role (the loader's lane 0, each MMA
  // warp group's first thread); nullptr when there is no probe or this thread is not that one.
  PlannedProbeRecord* probe = nullptr;
  if (params.probe != nullptr && thread % 128 == 0) {
    probe = params.probe + (cluster_id * Types::kClusterSize + int(rank_in_cluster)) * kProbeRoles + warp_group;
  }

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
  }
  if (warp_group == 0 && warp_in_group == 0) {
    auto tensormaps = mainloop.tensormaps_init(params.mainloop, smem.tensormaps, sm_count, sm_idx);
    auto write_state = cutlass::make_producer_start_state<Pipeline>();
    const auto problem = make_shape(params.a_rows, params.N, params.K, 1);
    Tensor mA = params.mainloop.tma_load_a.get_tma_tensor(make_shape(params.a_rows, params.K, 1));
    Tensor mB = params.mainloop.tma_load_b.get_tma_tensor(make_shape(params.N, params.K, 1));
    Tensor gB_nkl = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
    int group = -1;
    // The claimer claims one item ahead, so the mates learn their next item while this one's
    // loads are issued.
    const auto claim = [&](int seq) {
      const int item = lane == 0 ? planned_ring_claim<Types::kClusterSize>(smem.ring, seq, params.item_counter, items) : 0;
      return __shfl_sync(0xffffffffu, item, 0);
    };
    if (claimer) planned_probe(probe, ProbeStep::RingClaim, 0, -1, write_state, 0, 0);
    int next = claimer ? claim(0) : 0;
    for (int seq = 0;; ++seq) {
      int item;
      if (claimer) {
        item = next;
        if (item < 0) break;
        planned_probe(probe, ProbeStep::RingClaim, seq + 1, item, write_state, 0, 0);
        next = claim(seq + 1);
      } else {
        if (dynamic) planned_probe(probe, ProbeStep::RingRead, seq, -1, write_state, 0, 0);
        item = dynamic ? planned_ring_read(smem.ring, seq, lane) : static_item(seq);
        if (item < 0) break;
      }
      const int index = item * Types::kClusterSize + int(rank_in_cluster);
      const GemmTileEntry e = entry_at(index);
      if (params.tile_waits.counter_flags > 0 && plan_tiles != nullptr) {
        planned_wait_for_tile(params.tile_waits, *params.plan, plan_tiles[index], lane);
      }
      planned_probe(probe, ProbeStep::Load, seq, item, write_state, 0, e.rows);
      if (e.group != group) {
        // The whole warp read the smem descriptors (cp_fence_release) for the previous group;
        // only the elected lane went on to issue that group's loads. Converge before that lane
        // rewrites them.
        __syncwarp();
        mainloop.tensormaps_perform_update(smem.tensormaps, params.mainloop, tensormaps, problem, e.group);
        __syncwarp();
        mainloop.tensormaps_cp_fence_release(smem.tensormaps, tensormaps);
        mainloop.tensormaps_fence_acquire(tensormaps);
        group = e.group;
      }
      // A's tile starts at the entry's first row, wherever that is (rows past the group belong
      // to the next group or are out of bounds: loaded, never stored).
      Tensor gA_mkl = local_tile(domain_offset(make_coord(e.row_begin, 0, 0), mA), TileShape{}, make_coord(_, _, _),
                                 Step<_1, X, _1>{});
      auto k_iter = cute::make_coord_iterator(shape<3>(gA_mkl));
      mainloop.load(params.mainloop, pipeline, write_state, cute::make_tuple(gA_mkl, gB_nkl), tensormaps,
                    make_coord(0, e.col_tile, _, 0), k_iter, k_tiles, lane, rank_in_cluster, smem.mainloop);
      write_state.advance(k_tiles);
    }
    // Do not leave while a mate may still multicast into this CTA or release its stages.
    planned_probe(probe, ProbeStep::LoadTail, -1, -1, write_state, 0, 0);
    mainloop.load_tail(pipeline, write_state);
    planned_probe(probe, dynamic && Types::kClusterSize > 1 ? ProbeStep::ClusterExit : ProbeStep::Done, -1, -1, write_state, 0, 0);
  } else if (warp_group > 0) {
    cutlass::arch::warpgroup_reg_alloc<232>();
    const int mma_thread = thread - 128;
    TiledMma tiled_mma;
    auto read_state = typename Mainloop::PipelineState{};
    auto thr_mma = tiled_mma.get_thread_slice(mma_thread);
    Tensor tile_coord = thr_mma.partition_C(make_identity_tensor(take<0, 2>(TileShape{})));
    constexpr int kPasses = kEpilogue == PlannedEpilogue::SwiGLU ? 1 : 2;
    __nv_bfloat16* stage = smem.stage;

    for (int seq = 0;; ++seq) {
      if (dynamic) planned_probe(probe, ProbeStep::RingRead, seq, -1, read_state, 0, 0);
      const int item = dynamic ? planned_ring_read(smem.ring, seq, lane) : static_item(seq);
      if (item < 0) break;
      const int index = item * Types::kClusterSize + int(rank_in_cluster);
      const GemmTileEntry e = entry_at(index);
      if (params.tile_times != nullptr && mma_thread == 0) params.tile_times[2 * index] = planned_globaltimer();

      Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
      const bool half_is_padding = mma_thread / 128 * kRowsPerWarpGroup >= e.rows;
      if (half_is_padding && (params.padding_mma == PaddingMma::SkipAll ||
                              (params.padding_mma == PaddingMma::SkipHalfTiles && e.rows > 0))) {
        // Every row of this warp group's half is padding (a band of <= 64 rows, or a cluster's
        // padding mate): consume the stages without MMAs, so the other warp group has the tensor
        // cores to itself (the tile takes about half the time) and the loads, which a cluster
        // mate may share, are released as usual.
        // One thread walks the stages for the whole group: it waits for each stage to fill and
        // then gives the group's release, one arrival on the stage's empty barrier of every CTA
        // of the cluster (what CUTLASS's consumer_release spreads over the group's threads:
        // each consumer warp group owes one arrival to every CTA in its cluster row or column,
        // which in a cluster of two, the only size here, is both). Every thread of the group waiting and releasing,
        // as the MMA path does, stalled: only warps 0 and 1 signal the release, and without
        // the wgmma, which gathers the whole group, nothing held warps 2 and 3, which could
        // still be waiting for a stage's phase after it was released and refilled twice more;
        // a parity wait then waits for a phase that never comes (planned_gemm_stress --probe,
        // 2026-12-04: one warp group in the epilogue barrier, its mate at the next item).
        // A named barrier per stage over the group cured the stall but made racecheck report
        // the staging buffer's epilogue accesses (barrier 8) as races.
        if (mma_thread % 128 == 0) {
          auto state = read_state;
          for (int k = 0; k < k_tiles; ++k) {
            planned_probe(probe, ProbeStep::SkipWait, seq, item, state, k, e.rows);
            smem.pipeline.full_barrier_[state.index()].wait(state.phase());
            CUTLASS_PRAGMA_UNROLL
            for (uint32_t rank = 0; rank < uint32_t(Types::kClusterSize); ++rank) {
              smem.pipeline.empty_barrier_[state.index()].arrive(rank, 1u);
            }
            ++state;
          }
        }
        __syncwarp();
        clear(accum);
      } else {
        planned_probe(probe, ProbeStep::Mma, seq, item, read_state, 0, e.rows);
        mainloop.mma(pipeline, read_state, accum, k_tiles, mma_thread, smem.mainloop, params.mainloop);
        mainloop.mma_tail(pipeline, read_state, k_tiles);
      }
      read_state.advance(k_tiles);
      planned_probe(probe, ProbeStep::Epilogue, seq, item, read_state, 0, e.rows);

      const int64_t col_base = int64_t(e.col_tile) * kOutTileCols;
      CUTLASS_PRAGMA_UNROLL
      for (int pass = 0; pass < kPasses; ++pass) {
        // accum(i), accum(i + 1) (i even) are columns c, c + 1 of one row (the wgmma accumulator
        // layout): SwiGLU's gate and up, or two neighbours stored as one bf16x2 word (half the
        // smem store instructions of element-wise stores; a pass boundary, 128, is even).
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); i += 2) {
          const int r = get<0>(tile_coord(i));
          const int c = get<1>(tile_coord(i));
          // the GEMM's columns of accum(i) and accum(i + 1): (gate, up) or two neighbours
          const int64_t gemm_col = (kEpilogue == PlannedEpilogue::SwiGLU ? 2 * col_base : col_base) + c;
          float v0 = accum(i), v1 = accum(i + 1);
          if (params.bias != nullptr && gemm_col < params.N) {  // (N is even: both columns are in)
            const float* b = params.bias + int64_t(e.group) * params.N + gemm_col;
            v0 += b[0];
            v1 += b[1];
          }
          if constexpr (kEpilogue == PlannedEpilogue::SwiGLU) {
            stage[r * kStagePitch + c / 2] = __float2bfloat16_rn(params.plain_swiglu ? planned_silu(v0) * v1
                                                                                           : planned_clamped_swiglu(params.swiglu, v0, v1));
          } else {
            const int sc = c - pass * kStageCols;
            if (sc >= 0 && sc < kStageCols) {
              if constexpr (kEpilogue == PlannedEpilogue::GELU) {
                v0 = planned_gelu(v0);
                v1 = planned_gelu(v1);
              }
              *reinterpret_cast<__nv_bfloat162*>(stage + r * kStagePitch + sc) = __floats2bfloat162_rn(v0, v1);
            }
          }
        }
        planned_epilogue_barrier();
        // 16 chunks of 8 columns per row; only the entry's real rows and the matrix's columns.
        constexpr int kChunksPerRow = kStageCols / 8;
        const int64_t pass_col = col_base + pass * kStageCols;
        for (int chunk = mma_thread; chunk < kPlannedTileM * kChunksPerRow; chunk += kMmaThreads) {
          const int r = chunk / kChunksPerRow;
          const int64_t col = pass_col + (chunk % kChunksPerRow) * 8;
          if (r < e.rows && col < params.n_out) {
            const uint4 v = *reinterpret_cast<const uint4*>(stage + r * kStagePitch + (chunk % kChunksPerRow) * 8);
            *reinterpret_cast<uint4*>(params.D + (int64_t(e.row_begin) + r) * params.n_out + col) = v;
          }
        }
        planned_epilogue_barrier();
      }
      // Every MMA thread's stores are ordered before the barrier above; the fence makes them
      // visible at GPU scope before the flag (cumulativity), so an acquiring reader sees the tile.
      if (mma_thread == 0) {
        if (e.flag >= 0 && params.flags != nullptr) {
          __threadfence();
          atomicAdd(params.flags + (e.flag - params.flag_offset), 1u);
        }
        if (params.tile_times != nullptr) params.tile_times[2 * index + 1] = planned_globaltimer();
      }
    }
    planned_probe(probe, dynamic && Types::kClusterSize > 1 ? ProbeStep::ClusterExit : ProbeStep::Done, -1, -1, read_state, 0, 0);
  }
  // The dynamic fetch's mates post into and free slots of each other's ring up to their last
  // item: no CTA leaves before the whole cluster is done.
  if (dynamic && Types::kClusterSize > 1) {
    __syncwarp();
    cute::cluster_arrive();
    cute::cluster_wait();
    planned_probe_step(probe, ProbeStep::Done);
  }
#else
  // Built without sm_90a: never launched (the host checks the device), but keep the symbol.
  if (threadIdx.x == 0 && blockIdx.x == 0) asm volatile("trap;");
#endif
}

// Per group: A's descriptor spans all rows (shape a_rows x K), B's points at the group's weights.
// Also rewinds the dynamic fetch's item counter (when there is one) for the GEMM that follows.
template <class Stride>
__global__ void planned_gemm_setup_kernel(int groups, const cutlass::bfloat16_t* A, int a_rows,
                                          const cutlass::bfloat16_t* B, int N, int K,
                                          const cutlass::bfloat16_t** ptr_A, const cutlass::bfloat16_t** ptr_B,
                                          Stride* stride_A, Stride* stride_B, int* item_counter) {
  const int g = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (g == 0 && item_counter != nullptr) *item_counter = 0;
  if (g >= groups) return;
  ptr_A[g] = A;
  ptr_B[g] = B + int64_t(g) * N * K;
  stride_A[g] = cutlass::make_cute_packed_stride(Stride{}, cute::make_shape(a_rows, K, 1));
  stride_B[g] = cutlass::make_cute_packed_stride(Stride{}, cute::make_shape(N, K, 1));
}

template <class ClusterShape, PlannedEpilogue kEpilogue>
class PlannedGemmImpl final : public PlannedGemmBackend {
  using Types = PlannedGemmTypes<ClusterShape>;
  using Mainloop = typename Types::Mainloop;
  using Stride = typename Types::Stride;
  using Element = cutlass::bfloat16_t;

 public:
  PlannedGemmImpl(int max_groups, int device, int sm_limit) : max_groups_(max_groups) {
    const void* kernel = reinterpret_cast<const void*>(&planned_gemm_kernel<Types, kEpilogue>);
    TILEMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Types::kSmemBytes));
    if constexpr (Types::kClusterSize > 1) {
      TILEMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 0));
    }
    int sms = 0;
    TILEMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaLaunchAttribute attr{};
    cudaLaunchConfig_t config = launch_config(1, nullptr, attr);
    config.gridDim = dim3(Types::kClusterM, Types::kClusterN, 1);
    int max_clusters = 0;
    TILEMOE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config));
    if (max_clusters <= 0) {
      throw_internal("planned GEMM: no cluster of " + std::to_string(Types::kClusterSize) + " CTAs with " +
                     std::to_string(Types::kSmemBytes) + " bytes of shared memory fits on device " +
                     std::to_string(device));
    }
    const int sm_budget = sm_limit > 0 ? std::min(sm_limit, sms) : sms;
    clusters_ = std::min(max_clusters, sm_budget / Types::kClusterSize);
    if (clusters_ <= 0) {
      throw_bad_input("planned GEMM: sm_limit " + std::to_string(sm_limit) + " is smaller than the cluster size " +
                      std::to_string(Types::kClusterSize));
    }
    ptr_A_ = DeviceArray<const Element*>(std::size_t(max_groups));
    ptr_B_ = DeviceArray<const Element*>(std::size_t(max_groups));
    stride_A_ = DeviceArray<Stride>(std::size_t(max_groups));
    stride_B_ = DeviceArray<Stride>(std::size_t(max_groups));
    typename Mainloop::Arguments args{ptr_A_.data(), stride_A_.data(), ptr_B_.data(), stride_B_.data()};
    typename Types::ProblemShape problem{max_groups, nullptr, nullptr};
    workspace_ = DeviceArray<std::uint8_t>(Mainloop::get_workspace_size(problem, args, grid_ctas()));
    mainloop_params_ = Mainloop::to_underlying_arguments(problem, args, workspace_.data());
  }

  int grid_ctas() const override { return clusters_ * Types::kClusterSize; }

  // PaddingMma::Default resolved for this cluster shape (see planned_gemm.hpp for why).
  static PaddingMma resolve(PaddingMma mode) {
    if (mode != PaddingMma::Default) return mode;
    return PaddingMma::SkipAll;
  }
  // ItemFetch::Default resolved for the run's (resolved) padding mode and K (see planned_gemm.hpp).
  static ItemFetch resolve(ItemFetch fetch, PaddingMma padding_mma, int K) {
    if (fetch != ItemFetch::Default) return fetch;
    return padding_mma != PaddingMma::Issue && K >= 2048 ? ItemFetch::Dynamic : ItemFetch::Static;
  }

  void run(cudaStream_t stream, const PlannedGemmRun& r) override {
    const PaddingMma padding_mma = resolve(r.padding_mma);
    int* item_counter = resolve(r.item_fetch, padding_mma, r.K) == ItemFetch::Dynamic ? item_counter_.data() : nullptr;
    planned_gemm_setup_kernel<Stride><<<(r.groups + 127) / 128, 128, 0, stream>>>(
        r.groups, reinterpret_cast<const Element*>(r.A), r.a_rows, reinterpret_cast<const Element*>(r.B), r.N, r.K,
        ptr_A_.data(), ptr_B_.data(), stride_A_.data(), stride_B_.data(), item_counter);
    TILEMOE_CUDA_CHECK_LAUNCH("planned_gemm_setup_kernel<<<>>>");
    typename Types::Params params{mainloop_params_, r.table, r.count, r.plan, r.plan_layer, r.a_rows, r.N, r.K,
                                  kEpilogue == PlannedEpilogue::SwiGLU ? r.N / 2 : r.N,
                                  r.D, r.flags, r.flag_offset, r.tile_times, padding_mma, item_counter, r.probe, r.bias, r.swiglu,
                                  r.swiglu.is_default(), r.tile_waits};
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t config = launch_config(clusters_, stream, attr);
    TILEMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, planned_gemm_kernel<Types, kEpilogue>, params));
  }

 private:
  // grid: clusters side by side along x; a cluster is kClusterM x kClusterN CTAs, as the
  // collective's multicast masks and pipeline arrivals expect.
  static cudaLaunchConfig_t launch_config(int clusters, cudaStream_t stream, cudaLaunchAttribute& attr) {
    cudaLaunchAttribute* a = &attr;
    a->id = cudaLaunchAttributeClusterDimension;
    a->val.clusterDim.x = unsigned(Types::kClusterM);
    a->val.clusterDim.y = unsigned(Types::kClusterN);
    a->val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(clusters * Types::kClusterM), unsigned(Types::kClusterN), 1);
    config.blockDim = dim3(384, 1, 1);
    config.dynamicSmemBytes = std::size_t(Types::kSmemBytes);
    config.stream = stream;
    config.attrs = a;
    config.numAttrs = 1;
    return config;
  }

  int max_groups_;
  int clusters_ = 0;
  DeviceArray<const Element*> ptr_A_, ptr_B_;
  DeviceArray<Stride> stride_A_, stride_B_;
  DeviceArray<std::uint8_t> workspace_;
  DeviceArray<int> item_counter_{1};  // the dynamic fetch's: one run at a time, like the pointer arrays
  typename Mainloop::Params mainloop_params_{};
};

}  // namespace tilemoe::cuda::detail
