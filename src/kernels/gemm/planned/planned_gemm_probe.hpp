#pragma once
// Where the planned GEMM's warps are: an optional record per CTA and role that the kernel
// overwrites as it goes (PlannedGemmRun::probe). Put it in mapped host memory and the host can
// read it while a launch is stalled, which a device buffer cannot give (a copy would queue
// behind the stalled kernel or need a second stream that the stall may block too).
//
// Why it exists: launches with padding MMAs skipped on a 2x1 cluster stalled about once in a
// hundred at 16384-token shapes, and a racecheck of 1-row groups on a 1x2 cluster did not finish;
// reading the barriers' code did not show a lost arrival. Two snapshots of the records a few
// seconds apart tell a stalled launch (nothing moves) from a slow one, and which wait each role
// of each CTA sits in. Its first use found that stall (the skip loop in planned_gemm_kernel.cuh).
//
// Cost when set: two 16-byte stores by one thread of each role per item, and per K tile in the
// skip loop. Unset (nullptr, the default) the kernel branches past them.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm/planned/planned_gemm.hpp"

namespace tilemoe::cuda {

// The role's last step, written before the wait it names.
enum class ProbeStep : std::int32_t {
  NotStarted = 0,  // the record's initial value (the caller zeroes the records before a launch)
  RingRead,        // waits for item number seq in the ring (dynamic fetch; readers)
  RingClaim,       // the claimer waits for ring slot seq to be freed, then claims item seq
  Load,            // the loader issues the K tiles of `item`: waits on empty stages from `count`
  LoadTail,        // the loader waits until every stage it filled was released
  Mma,             // the warp group runs CUTLASS's MMA loop over `item`'s K tiles from `count`
  SkipWait,        // the warp group skips padding MMAs: waits on the full stage of `count`
  Epilogue,        // the warp group is in `item`'s epilogue (stage, store, flag)
  ClusterExit,     // at the final cluster barrier (dynamic fetch on a cluster)
  Done,            // left the kernel's loop (and, where there is one, the final barrier)
};
const char* probe_step_name(ProbeStep step);

// 32 bytes, written as two 16-byte stores: what a role does and where in the pipeline.
struct alignas(16) PlannedProbeRecord {
  std::int32_t step = 0;   // ProbeStep
  std::int32_t seq = -1;   // position in the cluster's item sequence
  std::int32_t item = -1;  // the item (cluster_size table entries from item * cluster_size)
  std::int32_t count = 0;  // pipeline state: K tiles this role has passed through the stages
  std::int32_t stage = 0;  // count % stages
  std::int32_t phase = 0;  // the barrier phase parity of that stage
  std::int32_t k = 0;      // K tile within the item (SkipWait), else 0
  std::int32_t rows = 0;   // the entry's rows
};
static_assert(sizeof(PlannedProbeRecord) == 32);

// Roles per CTA, in record order: the loader warp, MMA warp group 1, MMA warp group 2.
constexpr int kProbeRoles = 3;
const char* probe_role_name(int role);  // "loader", "mma wg1", "mma wg2"

// The records of one planned GEMM's grid in mapped host memory: the kernel writes them through
// device(), the host reads them at any time, while a launch is stalled too.
class MappedProbe {
 public:
  explicit MappedProbe(int grid_ctas);
  ~MappedProbe();
  MappedProbe(const MappedProbe&) = delete;
  MappedProbe& operator=(const MappedProbe&) = delete;

  PlannedProbeRecord* device() const { return device_; }  // PlannedGemmRun::probe
  void clear();  // every record NotStarted; only between launches
  // A copy of the records, read as the kernel may still be writing them.
  std::vector<PlannedProbeRecord> snapshot() const;

 private:
  PlannedProbeRecord* host_ = nullptr;
  PlannedProbeRecord* device_ = nullptr;
  std::size_t records_ = 0;
};

// How many of the records are Done.
std::size_t roles_done(const std::vector<PlannedProbeRecord>& records);

// A readable account of two snapshots (each grid_ctas * kProbeRoles records, cluster-major)
// taken some time apart: per role and step how many CTAs sit there and how many moved between
// the snapshots, then every role that did not finish, with its CTA, cluster rank, item and
// pipeline position, and the table entries of its item (table: the launch's entries, host copy).
std::string describe_probe(const std::vector<PlannedProbeRecord>& first, const std::vector<PlannedProbeRecord>& second,
                           const std::vector<GemmTileEntry>& table, int max_lines = 200);

}  // namespace tilemoe::cuda
