#include "tilemoe/memory_estimate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

// Products of sizes from the command line can pass 2^64: saturate instead of wrapping, so
// that an absurd request reads as "too large", never as small.
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}
std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  return b > std::numeric_limits<std::uint64_t>::max() - a ? std::numeric_limits<std::uint64_t>::max() : a + b;
}
std::uint64_t u(std::int64_t v) { return v > 0 ? static_cast<std::uint64_t>(v) : 0; }

// A cgroup v2 (memory.max, memory.current) or v1 (limit_in_bytes, usage_in_bytes) limit on
// this process's memory, as what is left of it; max() when there is none.
std::uint64_t cgroup_headroom() {
  auto read_number = [](const char* path, std::uint64_t& value) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") return false;
    try {
      value = std::stoull(text);
    } catch (const std::exception&) {
      return false;
    }
    return true;
  };
  std::uint64_t limit = 0, used = 0;
  if ((read_number("/sys/fs/cgroup/memory.max", limit) && read_number("/sys/fs/cgroup/memory.current", used)) ||
      (read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) &&
       read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes", used))) {
    return limit > used ? limit - used : 0;
  }
  return std::numeric_limits<std::uint64_t>::max();
}

}  // namespace

StepMemory estimate_step_memory(const StepMemoryInputs& in) {
  if (in.world == nullptr) throw_internal("estimate_step_memory: no world");
  const EpWorld& world = *in.world;
  const MoeConfig& layer = world.layer;
  const std::uint64_t tokens = u(world.total_tokens()), h = u(layer.hidden), f = u(layer.ffn_hidden),
                      experts = u(layer.num_experts), k = u(layer.top_k), ranks = u(world.world_size());
  const std::uint64_t element = dtype_size(layer.dtype);
  StepMemory m;
  // inputs in the storage dtype and as read (fp32), logits twice (read, split per rank),
  // routing (expert id, weight, kept flag per slot), the files as read
  m.data = add(add(mul(mul(tokens, h), element + 4), mul(mul(tokens, experts), 8)), add(mul(mul(tokens, k), 9), in.file_bytes));
  const std::uint64_t matrices = layer.activation == Activation::SwiGLU ? 3 : 2;
  m.weights = add(mul(mul(mul(experts, h), f), 4 * matrices), mul(mul(h, u(in.shared_ffn_hidden)), 4 * matrices + 4));
  if (in.expert_biases) m.weights = add(m.weights, mul(mul(experts, add(mul(f, 2), h)), 4));
  if (!in.expert_weights) m.weights = 0;
  m.references = add(in.cpu_engine ? mul(mul(tokens, h), element) : 0, in.fp64_reference ? mul(mul(tokens, h), 8) : 0);
  // per strategy: the output of every rank, and the plan's per-slot tables (source row, weight)
  m.results = mul(u(in.strategies), add(mul(mul(tokens, h), element), mul(mul(tokens, k), 12)));
  if (in.routing != nullptr && in.cpu_engine) {
    // Every rank's buffers are as large as the largest rank's (symmetric allocation). Expert
    // rows: the kept slots routed to the rank's experts (no strategy pads them); Received (a
    // dispatch once per rank) holds at most as many; combine rows: the rank's own kept slots.
    const std::uint64_t local_experts = ranks > 0 ? experts / ranks : 0;
    std::vector<std::uint64_t> received(ranks, 0);
    std::uint64_t max_tokens = 0, max_combine = 0;
    for (std::size_t r = 0; r < in.routing->size() && r < ranks; ++r) {
      const Routing& routing = (*in.routing)[r];
      std::uint64_t kept = 0;
      for (std::size_t s = 0; s < routing.expert.size(); ++s) {
        if (!routing.kept[s]) continue;
        ++kept;
        const auto owner = static_cast<std::size_t>(u(routing.expert[s]) / std::max<std::uint64_t>(local_experts, 1));
        if (owner < ranks) ++received[owner];
      }
      max_tokens = std::max(max_tokens, u(world.tokens_per_rank[r]));
      max_combine = std::max(max_combine, kept);
    }
    std::uint64_t max_expert_rows = 0;
    for (const std::uint64_t rows : received) max_expert_rows = std::max(max_expert_rows, rows);
    const std::uint64_t per_rank = add(add(mul(mul(max_tokens, h), 2 * element),          // Input, Output
                                           mul(mul(max_expert_rows, h), 3 * element)),     // ExpertIn, ExpertOut, Received
                                       add(mul(mul(max_expert_rows, f), element),          // Activation
                                           mul(mul(max_combine, h), element)));            // CombineIn
    m.executor = add(mul(per_rank, ranks), mul(mul(tokens, k), 24));  // + plan tables per slot
  }
  return m;
}

std::uint64_t StepMemory::total() const { return add(add(add(data, weights), add(references, executor)), results); }

std::string StepMemory::describe() const {
  return memory_text(total()) + " (data " + memory_text(data) + ", expert weights " + memory_text(weights) + ", references " +
         memory_text(references) + ", executor buffers " + memory_text(executor) + ", kept results " + memory_text(results) + ")";
}

std::uint64_t available_memory_bytes() {
  std::uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = mul(kib, 1024);
      break;
    }
  }
  const std::uint64_t headroom = cgroup_headroom();
  if (available == 0) return headroom == std::numeric_limits<std::uint64_t>::max() ? 0 : headroom;
  return std::min(available, headroom);
}

std::uint64_t parse_memory_size(const std::string& text, const std::string& option) {
  const std::string usage = option + " '" + text + "' is not a size: write bytes, or a number with K, M, G or T (e.g. 512M, 1.5G)";
  std::size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw_bad_input(usage);
  }
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && suffix.back() == 'B') suffix.pop_back();
  double scale = 1.0;
  if (suffix == "K") scale = 0x1p10;
  else if (suffix == "M") scale = 0x1p20;
  else if (suffix == "G") scale = 0x1p30;
  else if (suffix == "T") scale = 0x1p40;
  else if (!suffix.empty() && suffix != "B") throw_bad_input(usage);
  if (!std::isfinite(value) || value <= 0.0 || text.find_first_of("xXpP") != std::string::npos) throw_bad_input(usage);
  const double bytes = value * scale;
  if (bytes >= 0x1p63) throw_bad_input(option + " '" + text + "' is larger than any machine's memory");
  return static_cast<std::uint64_t>(bytes);
}

std::string memory_text(std::uint64_t bytes) {
  if (bytes == std::numeric_limits<std::uint64_t>::max()) return "more than 16 EiB";
  char text[48];
  if (bytes < 1024) {
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = static_cast<double>(bytes) / 1024.0;
    int unit = 0;
    while (value >= 1024.0 && unit < 5) value /= 1024.0, ++unit;
    std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  }
  return text;
}

void check_step_memory(const StepMemory& needed, std::uint64_t limit, const std::string& limit_source) {
  if (limit == 0 || needed.total() <= limit) return;
  throw_bad_input("this step needs about " + needed.describe() + ", more than " + limit_source + " (" + memory_text(limit) +
                  "): use fewer --tokens, a smaller --hidden, --ffn-hidden or --experts, fewer strategies (--strategy), or " +
                  "--max-memory if the estimate is too cautious");
}

}  // namespace tilemoe
