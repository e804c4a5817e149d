#pragma once
// What one CPU step will hold in host memory, estimated before it is allocated, so that a step
// that cannot fit is refused with the size it needs (exit 2) instead of failing in an allocation
// (std::bad_alloc) or growing until the kernel kills the process.
#include <cstdint>
#include <string>
#include <vector>

#include "tilemoe/config.hpp"
#include "tilemoe/routing.hpp"

namespace tilemoe {

struct StepMemory {
  std::uint64_t data = 0;        // inputs, router logits, routing, and the files they came from
  std::uint64_t weights = 0;     // expert weights, held as fp32 ([E][hidden][ffn] per matrix)
  std::uint64_t references = 0;  // the dense reference's outputs and the fp64 reference
  std::uint64_t executor = 0;    // one strategy's run: every rank's row buffers, plan tables
  std::uint64_t results = 0;     // the outputs and plans kept per strategy for the report
  std::uint64_t total() const;   // saturates at 2^64 - 1 rather than wrap
  std::string describe() const;  // "2.1 GiB (data 1.0 GiB, weights ...)"
};

struct StepMemoryInputs {
  const EpWorld* world = nullptr;
  // the routing, once known: the executor's buffers follow the rows each rank receives; without
  // it they are not counted yet (the first check, before the data exists)
  const std::vector<Routing>* routing = nullptr;
  int strategies = 1;              // how many strategies run one after another, results kept
  std::uint64_t file_bytes = 0;    // --inputs and --weights, read whole into memory
  bool fp64_reference = true;      // whether the fp64 reference is computed
  // whether the CPU engine runs the whole step (its row buffers, plans and the dense
  // reference); false for the CUDA backend, whose host oracle runs on a bounded token sample
  bool cpu_engine = true;
  std::int64_t shared_ffn_hidden = 0;  // the layer's shared expert's width (0: none), held as an expert's weights
  bool expert_biases = false;          // the experts have biases (GPT-OSS)
  bool expert_weights = true;          // the command holds the experts' weights (not to compile plans only)
};
StepMemory estimate_step_memory(const StepMemoryInputs& inputs);

// The memory this process may still take: MemAvailable of /proc/meminfo, lowered to a cgroup's
// limit where one applies; 0 when neither can be read (then nothing is refused).
std::uint64_t available_memory_bytes();

// "1.5G", "512M", "64k", "1000000" (bytes; binary suffixes K, M, G, T, case-insensitive, an
// optional trailing B): a bad-input error naming `option` for anything else.
std::uint64_t parse_memory_size(const std::string& text, const std::string& option);

// "3.2 GiB", "512 MiB", "800 bytes".
std::string memory_text(std::uint64_t bytes);

// Throws a bad-input error when the estimate exceeds `limit` (0 = no limit), naming the bytes
// needed, what they are, where the limit comes from (`limit_source`) and what to change.
void check_step_memory(const StepMemory& needed, std::uint64_t limit, const std::string& limit_source);

}  // namespace tilemoe
