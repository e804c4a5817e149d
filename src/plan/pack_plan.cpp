// A plan as one blob: a fixed header (the scalars and each table's offset and length), then
// the tables back to back, each aligned to 16 bytes. A GPU executor copies the blob in one
// cudaMemcpy and points its kernels at the tables.
#include <cstring>
#include <type_traits>

#include "tilemoe/error.hpp"
#include "tilemoe/plan.hpp"

namespace tilemoe {

namespace {

constexpr std::uint64_t kMagic = 0x324e414c50454f4dull;  // "MOEPLAN2": with Received's rows
constexpr int kTables = 12;

struct TableRef {
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
};

struct Header {
  std::uint64_t magic = kMagic;
  std::uint64_t total_bytes = 0;
  Strategy strategy;
  Activation activation;
  DType dtype;
  std::int32_t rank, world_size, compute_workers, comm_workers;
  std::int64_t tokens, hidden, ffn_hidden, top_k, tile_m, tile_n0, tile_n1, expert_rows, combine_rows, received_rows;
  std::uint32_t flag_count, row_arrival_flag;
  TableRef tables[kTables];
};
static_assert(std::is_trivially_copyable_v<Header>);

template <typename F>
void for_each_table(StepPlan& plan, F&& f) {
  f(plan.experts);
  f(plan.zero_rows);
  f(plan.gather_rows);
  f(plan.waits);
  f(plan.tiles);
  f(plan.segments);
  f(plan.combines);
  f(plan.combine_source_row);
  f(plan.combine_weight);
  f(plan.expert_in_scale);
  f(plan.compute_queue);
  f(plan.comm_queue);
}

std::uint64_t align16(std::uint64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

std::vector<std::byte> pack_plan(const StepPlan& source) {
  StepPlan plan = source;
  Header header{};
  header.magic = kMagic;
  header.strategy = plan.strategy;
  header.activation = plan.activation;
  header.dtype = plan.dtype;
  header.rank = plan.rank;
  header.world_size = plan.world_size;
  header.compute_workers = plan.compute_workers;
  header.comm_workers = plan.comm_workers;
  header.tokens = plan.tokens;
  header.hidden = plan.hidden;
  header.ffn_hidden = plan.ffn_hidden;
  header.top_k = plan.top_k;
  header.tile_m = plan.tile_m;
  header.tile_n0 = plan.tile_n0;
  header.tile_n1 = plan.tile_n1;
  header.expert_rows = plan.expert_rows;
  header.combine_rows = plan.combine_rows;
  header.received_rows = plan.received_rows;
  header.flag_count = plan.flag_count;
  header.row_arrival_flag = plan.row_arrival_flag;
  std::uint64_t at = align16(sizeof(Header));
  int t = 0;
  for_each_table(plan, [&](auto& table) {
    using T = typename std::decay_t<decltype(table)>::value_type;
    header.tables[t++] = {at, table.size()};
    at = align16(at + table.size() * sizeof(T));
  });
  header.total_bytes = at;
  std::vector<std::byte> blob(at);
  std::memcpy(blob.data(), &header, sizeof header);
  t = 0;
  for_each_table(plan, [&](auto& table) {
    using T = typename std::decay_t<decltype(table)>::value_type;
    if (!table.empty()) std::memcpy(blob.data() + header.tables[t].offset, table.data(), table.size() * sizeof(T));
    ++t;
  });
  return blob;
}

StepPlan unpack_plan(const std::vector<std::byte>& blob) {
  Header header;
  if (blob.size() < sizeof header) throw_bad_input("plan blob is shorter than its header");
  std::memcpy(&header, blob.data(), sizeof header);
  if (header.magic != kMagic || header.total_bytes != blob.size()) {
    throw_bad_input("plan blob has a wrong magic number or length");
  }
  StepPlan plan;
  plan.strategy = header.strategy;
  plan.activation = header.activation;
  plan.dtype = header.dtype;
  plan.rank = header.rank;
  plan.world_size = header.world_size;
  plan.compute_workers = header.compute_workers;
  plan.comm_workers = header.comm_workers;
  plan.tokens = header.tokens;
  plan.hidden = header.hidden;
  plan.ffn_hidden = header.ffn_hidden;
  plan.top_k = header.top_k;
  plan.tile_m = header.tile_m;
  plan.tile_n0 = header.tile_n0;
  plan.tile_n1 = header.tile_n1;
  plan.expert_rows = header.expert_rows;
  plan.combine_rows = header.combine_rows;
  plan.received_rows = header.received_rows;
  plan.flag_count = header.flag_count;
  plan.row_arrival_flag = header.row_arrival_flag;
  int t = 0;
  for_each_table(plan, [&](auto& table) {
    using T = typename std::decay_t<decltype(table)>::value_type;
    const TableRef ref = header.tables[t++];
    if (ref.offset > blob.size() || ref.count > (blob.size() - ref.offset) / sizeof(T)) {
      throw_bad_input("plan blob table " + std::to_string(t - 1) + " lies outside the blob");
    }
    table.resize(ref.count);
    if (ref.count) std::memcpy(table.data(), blob.data() + ref.offset, ref.count * sizeof(T));
  });
  return plan;
}

}  // namespace tilemoe
