#include "device_plan_tables.hpp"

#include <algorithm>
#include <climits>

#include "core/cuda/device_footprint.hpp"
#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda {

DeviceFootprint DevicePlanTables::device_bytes(const plan_detail::PlanCapacity& capacity, int world, int experts, int extra_prefix) {
  using namespace plan_detail;
  const auto& n = capacity.entries;
  DeviceFootprint f;
  f.add(n[kExpertsTable], sizeof(LocalExpert));
  f.add(n[kWaitsTable], sizeof(FlagWait));
  f.add(n[kTilesTable], sizeof(GemmTile));
  f.add(n[kSegmentsTable], sizeof(Segment));
  f.add(n[kCombinesTable], sizeof(CombineTask));
  f.add(n[kComputeQueueTable], sizeof(TaskRef));
  f.add(n[kCommQueueTable], sizeof(TaskRef));
  f.add(1, sizeof(PlanTables));
  f.add(static_cast<std::size_t>(world) * static_cast<std::size_t>(experts + 1), sizeof(int));           // offset
  f.add(static_cast<std::size_t>(world) * static_cast<std::size_t>(experts / world + 1), sizeof(int));  // rank_row
  f.add(static_cast<std::size_t>(prefix_room(world, experts, extra_prefix)), sizeof(int));                   // prefix
  return f;
}

DevicePlanTables::DevicePlanTables(const plan_detail::PlanCapacity& capacity, int world, int experts, int extra_prefix)
    : capacity_(capacity), world_(world), experts_(experts), extra_prefix_(extra_prefix) {
  using namespace plan_detail;
  const auto& n = capacity.entries;
  experts_table_ = DeviceArray<LocalExpert>(n[kExpertsTable]);
  waits_ = DeviceArray<FlagWait>(n[kWaitsTable]);
  tiles_ = DeviceArray<GemmTile>(n[kTilesTable]);
  segments_ = DeviceArray<Segment>(n[kSegmentsTable]);
  combines_ = DeviceArray<CombineTask>(n[kCombinesTable]);
  compute_queue_ = DeviceArray<TaskRef>(n[kComputeQueueTable]);
  comm_queue_ = DeviceArray<TaskRef>(n[kCommQueueTable]);
  offset_ = DeviceArray<int>(static_cast<std::size_t>(world) * static_cast<std::size_t>(experts + 1));
  rank_row_ = DeviceArray<int>(static_cast<std::size_t>(world) * static_cast<std::size_t>(experts / world + 1));
  prefix_ = DeviceArray<int>(static_cast<std::size_t>(prefix_room(world, experts, extra_prefix)));
  PlanTables tables;
  tables.experts = {experts_table_.data(), n[kExpertsTable], 0};
  tables.waits = {waits_.data(), n[kWaitsTable], 0};
  tables.tiles = {tiles_.data(), n[kTilesTable], 0};
  tables.segments = {segments_.data(), n[kSegmentsTable], 0};
  tables.combines = {combines_.data(), n[kCombinesTable], 0};
  tables.compute_queue = {compute_queue_.data(), n[kComputeQueueTable], 0};
  tables.comm_queue = {comm_queue_.data(), n[kCommQueueTable], 0};
  view_ = DeviceArray<PlanTables>(&tables, 1);
  empty_ = tables;
}

int DevicePlanTables::most_entries() const {
  std::uint32_t most = 1;
  for (std::uint32_t n : capacity_.entries) most = std::max(most, n);
  return static_cast<int>(std::min<std::uint32_t>(most, INT_MAX));
}

namespace {
template <typename T>
void fetch_table(cudaStream_t stream, const PlanTable<T>& device, PlanTable<T>& host) {
  host.count = device.count;
  if (device.count > 0) {
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(host.data, device.data, device.count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  }
}
}  // namespace

void DevicePlanTables::download(cudaStream_t stream, const std::function<void(const char*)>& wait, StepPlan& plan) const {
  PlanTables device;
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(&device, view_.data(), sizeof device, cudaMemcpyDeviceToHost, stream));
  wait("the device plan's header");
  plan_detail::HostPlanTables host(capacity_);
  PlanTables& h = host.view();
  h.header = device.header;
  fetch_table(stream, device.experts, h.experts);
  fetch_table(stream, device.waits, h.waits);
  fetch_table(stream, device.tiles, h.tiles);
  fetch_table(stream, device.segments, h.segments);
  fetch_table(stream, device.combines, h.combines);
  fetch_table(stream, device.compute_queue, h.compute_queue);
  fetch_table(stream, device.comm_queue, h.comm_queue);
  wait("the device plan's tables");
  plan_detail::copy_plan_tables(h, plan);
}

}  // namespace tilemoe::cuda
