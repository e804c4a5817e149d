#pragma once
// One rank's plan tables in device memory, with the room fixed when a layer is built: a
// strategy's compiler kernel (src/strategies/<system>/device_compiler.cu) rewrites them every
// step from the exchanged counts, with no allocation and no host synchronisation.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

#include "core/cuda/device_footprint.hpp"
#include "plan/plan_tables.hpp"
#include "tilemoe/cuda/device_array.hpp"

namespace tilemoe::cuda {

class DevicePlanTables {
 public:
  // Room for plans of a world of `world` ranks and `experts` global experts; `extra_prefix`: the
  // entries a strategy's prefix sums take past the sequential ones (see prefix_room).
  DevicePlanTables(const plan_detail::PlanCapacity& capacity, int world, int experts, int extra_prefix = 0);
  // The device memory the tables take (DeviceFootprint: pages, an upper bound).
  static DeviceFootprint device_bytes(const plan_detail::PlanCapacity& capacity, int world, int experts, int extra_prefix = 0);

  PlanTables* view() const { return view_.data(); }   // [1] the tables, as the compiler writes them
  // The tables' pointers and room with no entries (what a compiler kernel takes by value, so
  // that its CTAs never read the header and counts its first thread writes).
  const PlanTables& empty_tables() const { return empty_; }
  int most_entries() const;  // the largest table's room: a compiler's threads, one per entry
  FlagWait* waits() const { return waits_.data(); }  // the waits table (a test corrupts one)
  Segment* segments() const { return segments_.data(); }  // the segments table (a test corrupts one)
  int* offset() const { return offset_.data(); }      // [world][experts + 1] the compiler's scratch
  int* rank_row() const { return rank_row_.data(); }  // [world][experts / world + 1] ditto
  int* prefix() const { return prefix_.data(); }      // [prefix_room]: the strategy's prefix sums over the local experts
  // Room for three rows of prefix sums over the local experts (sequential: one per GEMM;
  // tile_signal: a third, of its remote bands), or the sequential two and `extra_prefix` more
  // where that is larger (comet's).
  static int prefix_room(int world, int experts, int extra_prefix = 0) {
    const int L = experts / world;
    return 3 * (L + 2) > 2 * (L + 2) + extra_prefix ? 3 * (L + 2) : 2 * (L + 2) + extra_prefix;
  }
  int prefix_size() const { return prefix_room(world_, experts_, extra_prefix_); }
  const plan_detail::PlanCapacity& capacity() const { return capacity_; }
  int world() const { return world_; }
  int experts() const { return experts_; }

  // Copies the last compiled plan's tables and header into `plan` (whose own header the caller
  // set): copies on `stream`, each batch followed by `wait(what)`, which must bound its wait.
  // An overflowed table is an internal error.
  void download(cudaStream_t stream, const std::function<void(const char*)>& wait, StepPlan& plan) const;

 private:
  plan_detail::PlanCapacity capacity_;
  int world_ = 0, experts_ = 0, extra_prefix_ = 0;
  DeviceArray<LocalExpert> experts_table_;
  DeviceArray<FlagWait> waits_;
  DeviceArray<GemmTile> tiles_;
  DeviceArray<Segment> segments_;
  DeviceArray<CombineTask> combines_;
  DeviceArray<TaskRef> compute_queue_, comm_queue_;
  DeviceArray<PlanTables> view_;
  PlanTables empty_;
  DeviceArray<int> offset_, rank_row_, prefix_;
};

}  // namespace tilemoe::cuda
