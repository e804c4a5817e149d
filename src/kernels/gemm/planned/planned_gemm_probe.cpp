#include "kernels/gemm/planned/planned_gemm_probe.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "tilemoe/cuda/cuda_check.hpp"

namespace tilemoe::cuda {

const char* probe_step_name(ProbeStep step) {
  switch (step) {
    case ProbeStep::NotStarted: return "not started";
    case ProbeStep::RingRead: return "ring read";
    case ProbeStep::RingClaim: return "ring claim";
    case ProbeStep::Load: return "load";
    case ProbeStep::LoadTail: return "load tail";
    case ProbeStep::Mma: return "mma";
    case ProbeStep::SkipWait: return "skip wait";
    case ProbeStep::Epilogue: return "epilogue";
    case ProbeStep::ClusterExit: return "cluster exit";
    case ProbeStep::Done: return "done";
  }
  return "unknown step";
}

const char* probe_role_name(int role) {
  switch (role) {
    case 0: return "loader";
    case 1: return "mma wg1";
    case 2: return "mma wg2";
  }
  return "unknown role";
}

namespace {

bool same(const PlannedProbeRecord& a, const PlannedProbeRecord& b) {
  return a.step == b.step && a.seq == b.seq && a.item == b.item && a.count == b.count && a.k == b.k;
}

std::string entry_text(const std::vector<GemmTileEntry>& table, long long index) {
  if (index < 0 || index >= static_cast<long long>(table.size())) return "(no entry " + std::to_string(index) + ")";
  const GemmTileEntry& e = table[static_cast<std::size_t>(index)];
  return "{group " + std::to_string(e.group) + ", rows " + std::to_string(e.row_begin) + "+" + std::to_string(e.rows) +
         ", col tile " + std::to_string(e.col_tile) + "}";
}

}  // namespace

MappedProbe::MappedProbe(int grid_ctas) : records_(static_cast<std::size_t>(std::max(grid_ctas, 0)) * kProbeRoles) {
  TILEMOE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), std::max<std::size_t>(records_, 1) * sizeof(PlannedProbeRecord),
                                   cudaHostAllocMapped));
  TILEMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  clear();
}

MappedProbe::~MappedProbe() { cudaFreeHost(host_); }

void MappedProbe::clear() { std::fill(host_, host_ + records_, PlannedProbeRecord{}); }

std::vector<PlannedProbeRecord> MappedProbe::snapshot() const {
  std::vector<PlannedProbeRecord> records(records_);
  for (std::size_t i = 0; i < records_; ++i) {
    // volatile: the kernel may be writing these while we read
    const volatile std::int32_t* src = reinterpret_cast<const volatile std::int32_t*>(host_ + i);
    std::int32_t* dst = reinterpret_cast<std::int32_t*>(&records[i]);
    for (std::size_t w = 0; w < sizeof(PlannedProbeRecord) / sizeof(std::int32_t); ++w) dst[w] = src[w];
  }
  return records;
}

std::size_t roles_done(const std::vector<PlannedProbeRecord>& records) {
  return static_cast<std::size_t>(std::count_if(records.begin(), records.end(), [](const PlannedProbeRecord& r) {
    return static_cast<ProbeStep>(r.step) == ProbeStep::Done;
  }));
}

std::string describe_probe(const std::vector<PlannedProbeRecord>& first, const std::vector<PlannedProbeRecord>& second,
                           const std::vector<GemmTileEntry>& table, int max_lines) {
  constexpr int cluster_size = kPlannedClusterSize;
  std::ostringstream out;
  if (first.size() != second.size() || first.size() % kProbeRoles != 0) {
    return "probe: snapshots of " + std::to_string(first.size()) + " and " + std::to_string(second.size()) +
           " records do not describe one grid\n";
  }
  const std::size_t ctas = first.size() / kProbeRoles;
  // (role, step) -> (roles there, roles that moved between the snapshots)
  std::map<std::pair<int, int>, std::pair<int, int>> tally;
  int moved = 0;
  for (std::size_t i = 0; i < second.size(); ++i) {
    const bool m = !same(first[i], second[i]);
    moved += m;
    auto& t = tally[{static_cast<int>(i % kProbeRoles), second[i].step}];
    ++t.first;
    t.second += m;
  }
  out << "probe: " << ctas << " CTAs, " << moved << " of " << second.size() << " roles moved between the snapshots ("
      << (moved == 0 ? "stalled" : "still running") << ")\n";
  for (const auto& [key, t] : tally) {
    out << "  " << probe_role_name(key.first) << " at " << probe_step_name(static_cast<ProbeStep>(key.second)) << ": "
        << t.first << " CTAs (" << t.second << " moved)\n";
  }
  int lines = 0;
  for (std::size_t cta = 0; cta < ctas; ++cta) {
    for (int role = 0; role < kProbeRoles; ++role) {
      const PlannedProbeRecord& r = second[cta * kProbeRoles + static_cast<std::size_t>(role)];
      if (static_cast<ProbeStep>(r.step) == ProbeStep::Done) continue;
      if (lines++ >= max_lines) {
        out << "  ... (more roles not done)\n";
        return out.str();
      }
      const int rank = static_cast<int>(cta % static_cast<std::size_t>(cluster_size));
      out << "  CTA " << cta << " (cluster " << cta / static_cast<std::size_t>(cluster_size) << ", rank " << rank << ") "
          << probe_role_name(role) << ": " << probe_step_name(static_cast<ProbeStep>(r.step)) << ", seq " << r.seq
          << ", item " << r.item << ", count " << r.count << " (stage " << r.stage << ", phase " << r.phase << ")";
      if (static_cast<ProbeStep>(r.step) == ProbeStep::SkipWait) out << ", K tile " << r.k;
      out << ", rows " << r.rows << (same(first[cta * kProbeRoles + static_cast<std::size_t>(role)], r) ? "" : " [moved]");
      if (r.item >= 0) {
        out << "; item's entries:";
        for (int mate = 0; mate < cluster_size; ++mate) {
          out << ' ' << entry_text(table, static_cast<long long>(r.item) * cluster_size + mate);
        }
      }
      out << '\n';
    }
  }
  return out.str();
}

}  // namespace tilemoe::cuda
