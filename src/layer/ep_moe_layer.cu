#include "tilemoe/cuda/ep_moe_layer.hpp"

#include <algorithm>
#include <climits>
#include <vector>

#include "core/cuda/current_device.hpp"
#include "comm/cuda/device_transport.hpp"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "exec/cuda/ep_exchange.hpp"
#include "ep_layer_inspector.hpp"
#include "expert_ffn.hpp"
#include "shared_expert_ffn.hpp"
#include "layer_routing.hpp"
#include "exec/cuda/gpu_rates.hpp"
#include "kernels/moe_kernels.hpp"
#include "exec/cuda/arrival_combine.hpp"
#include "exec/cuda/band_consumer.hpp"
#include "exec/cuda/plan_combine.hpp"
#include "exec/cuda/segment_copy.hpp"
#include "exec/cuda/send_lists.hpp"
#include "exec/cuda/input_scale.hpp"
#include "strategies/comet/device_compiler.hpp"
#include "strategies/comet/gpu_plan_shape.hpp"
#include "strategies/comet/gpu_setup.hpp"
#include "strategies/sequential/device_compiler.hpp"
#include "strategies/sequential/exchange_setup.hpp"
#include "strategies/sequential/gpu_plan_shape.hpp"
#include "strategies/tile_signal/device_compiler.hpp"
#include "strategies/tile_signal/gpu_plan_shape.hpp"
#include "strategies/tile_signal/gpu_setup.hpp"
#include "tilemoe/cuda/module_loading.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

// Host memory the device copies to and from asynchronously; freed with the layer.
template <typename T>
class PinnedArray {
 public:
  explicit PinnedArray(std::size_t count) : count_(count) {
    TILEMOE_CUDA_CHECK(cudaMallocHost(&data_, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  ~PinnedArray() { cudaFreeHost(data_); }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  T* data() const { return data_; }
  T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace

const char* dispatch_path_name(DispatchPath path) { return path == DispatchPath::Device ? "device" : "host"; }

namespace {

// EpMoeLayerOptions::dispatch_volume as a layer of this world runs it.
DispatchVolume resolved_dispatch_volume(const EpMoeLayerOptions& o, int world, bool remote_peers) {
  if (world == 1) return DispatchVolume::RowPerExpert;  // a world of one sends nothing: its plans are the same either way
  const bool can_place = o.dispatch == DispatchPath::Device && !remote_peers;
  if (!o.dispatch_volume) return can_place ? DispatchVolume::OncePerRank : DispatchVolume::RowPerExpert;
  if (*o.dispatch_volume == DispatchVolume::OncePerRank && !can_place) {
    throw_bad_input(std::string("a dispatch once per destination rank runs on the device dispatch path of a load/store world; ") +
                    (remote_peers ? "this world has peers on other nodes" : "the host path's all-to-all sends a row per expert") +
                    ": use row-per-expert");
  }
  return *o.dispatch_volume;
}

// The strategy a layer of this world runs for `o.strategy` before any cost model: comet in a
// world of one is sequential (nothing to overlap).
Strategy world_strategy(const EpMoeLayerOptions& o, int world) {
  return o.strategy == Strategy::Comet && world == 1 ? Strategy::Sequential : o.strategy;
}

// The flags segments may raise in this layer's region: comet's split arrivals need more than the
// other strategies' (comet_plan.hpp); 0 for those.
int segment_flags_of(const MoeConfig& c, int world, const EpMoeLayerOptions& o) {
  if (world_strategy(o, world) != Strategy::Comet) return 0;
  const std::int64_t split = comet_gpu_split_cols(c.hidden, o.comet);
  return static_cast<int>(plan_detail::comet_segment_flags(world, static_cast<int>((c.hidden + split - 1) / split)));
}

}  // namespace

const char* ep_stage_name(int stage) {
  static const char* names[] = {"router", "layout", "permute", "dispatch", "gemm0", "activation", "gemm1", "combine send", "combine"};
  return stage >= 0 && stage < kEpStageCount ? names[stage] : "?";
}

struct EpMoeLayer::Impl : LayerRouting {
  MoeConfig config;
  RankTransport* transport = nullptr;
  EpMoeLayerOptions options;
  int world = 1, rank = 0, local_experts = 0, device = 0, ctas_per_peer = 1;
  EpRegionLayout layout;
  DispatchVolume volume = DispatchVolume::RowPerExpert;  // as resolved for this world (every rank the same)
  cudaStream_t own = nullptr;  // the world's set-up stream: set-up and read-backs that must not wait for the peers' kernels
  bool failed = false;
  bool remote_peers = false;  // GIN peers: the rows sent live in the region (puts read the window)
  // A world of one on the device path, sequential: the expert rows are the permuted rows and
  // the returned rows the FFN's output, in the same order, so the step skips both exchange
  // copies (measured before: they made a world of one 1.13-2.00x the one-GPU layer, H100,
  // BENCHMARKS.md, 2026-12-06) and computes the same bits.
  bool direct = false;
  // The device path beyond a direct world of one: the counts kernel, then the segment copy runs
  // the plan's dispatch (and sequential's combine send).
  bool exchange_walks_plan = false;

  // this rank's permuted rows (not with a dispatch once per rank: its segments gather from the
  // input) and the FFN's output (the routing state is the base class)
  DeviceArray<__nv_bfloat16> send_rows, y;
  // a dispatch once per rank (exec/cuda/send_lists.hpp): the tokens sent to each rank, and each
  // token's position in each destination's list
  DeviceArray<int> rank_tokens, list_position;
  bool once_per_rank() const { return volume == DispatchVolume::OncePerRank; }
  // Llama-4's routing (RouterConfig::scales_input): the weights scale the experts' input
  // (exec/cuda/input_scale.hpp), and the combine weighs every output by one of these
  DeviceArray<float> ones;
  const float* combine_weight() const { return config.router.scales_input ? ones.data() : weight.data(); }
  InputScaleArgs input_scale_args(const plan_detail::StepCounts& counts, int tokens) const {
    InputScaleArgs a;
    a.layout = layout;
    a.counts = counts;
    a.expert = expert.data();
    a.weight = weight.data();
    a.slot_of_row = slot_of_row.data();
    a.tokens = tokens;
    a.top_k = static_cast<int>(config.top_k);
    a.hidden = static_cast<int>(config.hidden);
    a.expert_rows = local_row_offset.data() + local_experts;
    a.row_bound = layout.receive_capacity;
    return a;
  }
  // the receive side's table, written by the counts kernel (device path) or uploaded (host path)
  DeviceArray<std::uint64_t> epoch;
  DeviceArray<int> local_row_offset;
  // host path
  DeviceArray<int> gathered;          // [world][experts + 1]: every rank's row_offset
  DeviceArray<int> block_tables;      // [2 directions][3][blocks]
  DeviceArray<__nv_bfloat16> staging;  // rows in source-major order, as the all-to-alls move them
  std::unique_ptr<PinnedArray<int>> host_gathered, host_tables;
  std::unique_ptr<ExpertFfn> ffn;
  std::unique_ptr<SharedExpertFfn> shared;  // the layer's shared expert, if it has one
  // tile signal: GEMM1's band flags (the plan's flags from tile_signal_band_flag on), the
  // consumer's stream and the events that fork it off after GEMM0 and join it before the combine
  DeviceArray<unsigned> band_flags;
  // comet: GEMM1's tiles done per column split (the plan's flags from comet_split_flag on), which
  // the splits' sends wait for on the consumer stream
  DeviceArray<unsigned> split_flags;
  cudaStream_t consumer = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  int combine_ctas = 0;  // the owner's combine as rows land (tile_signal's token by token, comet's split by split): a
                         // persistent grid whose CTAs may all wait
  TileSignalGpuSchedule schedule;  // tile_signal's split and GEMM1 order, as the strategy chose them
  CometGpuSchedule comet;          // comet's column split and GEMM0's SMs, as the strategy chose them
  std::string split_note;          // how the split was chosen, for description()
  EpMoeLayerHarness harness;       // tests' fault injection, the exchange benchmark's mode
  int unsignalled_flag = 0;        // harness.unsignalled_band_wait: the band flag the corrupted wait names
  int unrunnable_flag = 0;         // harness.unrunnable_dispatch_segment: a flag id past the exchange's segment flags
  // The step's plan, compiled on the device from the exchanged counts by the strategy's compiler
  // (sequential or tile_signal): the device exchange walks its dispatch and combine segments, the
  // planned GEMMs its tiles, the band consumer its pieces (harness.build_device_plan builds the
  // sequential one where none of them runs: the host path on the stock GEMM); and the tokens
  // of the step that compiled it.
  std::unique_ptr<DevicePlanTables> device_plan;
  bool ffn_walks_plan = false;
  int device_plan_tokens = 0;
  plan_detail::SequentialShape device_plan_shape(std::int64_t tokens) const {
    return plan_detail::gpu_sequential_shape(config, rank, tokens, volume, layout.receive_capacity);
  }
  plan_detail::TileSignalShape tile_signal_plan_shape(std::int64_t tokens) const {
    return plan_detail::gpu_tile_signal_shape(config, rank, tokens, schedule.band_block, schedule.bands_per_segment, volume,
                                              layout.receive_capacity);
  }
  plan_detail::CometShape comet_plan_shape(std::int64_t tokens) const {
    return plan_detail::gpu_comet_shape(config, rank, tokens, volume, comet.split_cols, layout.receive_capacity);
  }
  bool is_comet() const { return options.strategy == Strategy::Comet; }
  // record_trace: the GEMMs' tile times (each indexed within its GEMM) and the consumer's unit
  // times of the last forward
  DeviceArray<unsigned long long> gemm0_tile_times, gemm1_tile_times, unit_times;

  void init(const MoeConfig& c, RankTransport& t, EpMoeLayerOptions o, EpMoeLayerHarness h);
  void agree_on_settings(bool split_chosen_here);
  void finish_init();
  std::byte* region(std::size_t offset) const { return transport->device_view().region[rank] + offset; }
  // The end of a step on `stream`, bounded by its device waits in a row (dispatch counts, rows,
  // (tile_signal) tile flags, combine): a stalled step is a Timeout error, never a hang.
  void wait_for_step(cudaStream_t stream) const {
    transport->synchronize(stream, "the end of the step", options.strategy == Strategy::Sequential ? 3 : 4);
  }
  // The set-up stream's copies and read-backs, bounded like any wait of the world.
  void wait_for_own(const char* what) const { transport->synchronize(own, what); }
  EpExchangeArgs exchange_args() const;
  // the plan's segments [first, first + count) as the exchange runs them, ended by `drain`'s
  // waits; `input` and `tokens`: the step's (a dispatch once per rank gathers from them)
  SegmentCopyArgs segment_args(SegmentDrain drain, int first, int count, const __nv_bfloat16* input, int tokens) const;
  int dispatch_segments() const { return plan_detail::dispatch_segment_count(world, local_experts, volume); }
  // the plan's combine segments (after the dispatch's): sequential's W L, comet's W L per split
  int combine_segments() const {
    return is_comet() ? world * local_experts * plan_detail::comet_splits(comet_plan_shape(0)) : world * local_experts;
  }
  std::uint32_t band_flag() const { return plan_detail::tile_signal_band_flag(world, volume); }
  std::uint32_t split_flag() const {  // comet's first split flag (comet_plan.hpp): split_flags holds one per split
    return plan_detail::comet_split_flag(world, static_cast<int>(split_flags.count()), 0);
  }
  // what the experts produced: their FFN's output, or with identity experts their input rows
  const std::byte* expert_out() const {
    return ffn ? reinterpret_cast<const std::byte*>(ffn_out()) : region(layout.dispatch_rows);
  }
  __nv_bfloat16* ffn_out() const {
    return remote_peers ? reinterpret_cast<__nv_bfloat16*>(region(layout.expert_out)) : y.data();
  }
  __nv_bfloat16* send_rows_ptr() const {
    return remote_peers ? reinterpret_cast<__nv_bfloat16*>(region(layout.send_rows)) : send_rows.data();
  }
  StepPlan download_plan(cudaStream_t stream) const;
  void host_dispatch(cudaStream_t stream, int tokens);
  void host_combine_send(cudaStream_t stream);
  std::vector<std::size_t> send_offset, send_bytes, recv_offset, recv_bytes;  // host path, this step

  ~Impl() {
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
  }
};

std::size_t EpMoeLayer::region_bytes(const MoeConfig& layer, int world, const EpMoeLayerOptions& options, bool remote_peers) {
  return ep_region_layout(world, layer.num_experts, layer.hidden, layer.tokens, layer.top_k, remote_peers, options.receive_rows,
                          resolved_dispatch_volume(options, world, remote_peers), layer.router.scales_input,
                          segment_flags_of(layer, world, options))
      .bytes;
}

std::size_t EpMoeLayer::device_bytes(const MoeConfig& c, int world, const EpMoeLayerOptions& options, bool remote_peers,
                                     std::int64_t shared_expert_ffn) {
  validate_cuda_layer(c);
  if (world < 1 || c.num_experts % world != 0) {
    throw_bad_input(std::to_string(c.num_experts) + " experts do not divide evenly over " + std::to_string(world) + " ranks");
  }
  const DispatchVolume volume = resolved_dispatch_volume(options, world, remote_peers);
  const EpRegionLayout layout = ep_region_layout(world, c.num_experts, c.hidden, c.tokens, c.top_k, remote_peers, options.receive_rows, volume,
                                                c.router.scales_input, segment_flags_of(c, world, options));
  const std::int64_t local_experts = c.num_experts / world;
  const auto H = static_cast<std::size_t>(c.hidden), E = static_cast<std::size_t>(c.num_experts),
             W = static_cast<std::size_t>(world), L = static_cast<std::size_t>(local_experts);
  const std::size_t slot_room = std::max<std::size_t>(static_cast<std::size_t>(std::max<std::int64_t>(c.tokens * c.top_k, 0)), 1);
  const auto receive_room = static_cast<std::size_t>(std::max<std::int64_t>(layout.receive_capacity, 1));
  DeviceFootprint f = LayerRouting::device_bytes(c);
  const Strategy strategy = world_strategy(options, world);
  const bool direct = world == 1 && !remote_peers && options.dispatch == DispatchPath::Device &&
                     strategy != Strategy::TileSignal && !options.record_trace;  // (as init decides)
  const bool once = volume == DispatchVolume::OncePerRank;
  if (!remote_peers && !direct && !once) f.add(slot_room * H, sizeof(__nv_bfloat16));  // send_rows
  if (c.router.scales_input) f.add(slot_room, sizeof(float));  // ones
  if (once) {
    f.add(W, sizeof(int));                                                                      // rank_tokens
    f.add(static_cast<std::size_t>(std::max<std::int64_t>(c.tokens, 1)) * W, sizeof(int));  // list_position
  }
  f.add(1, sizeof(std::uint64_t));                                  // epoch
  f.add(L + 1, sizeof(int));                                        // local_row_offset
  if (options.dispatch == DispatchPath::Host) {
    f.add(W * (E + 1), sizeof(int));                             // gathered
    f.add(2 * 3 * E, sizeof(int));                               // block_tables
    f.add(std::max(receive_room, slot_room) * H, sizeof(__nv_bfloat16));  // staging
  }
  if (!remote_peers) f.add(receive_room * H, sizeof(__nv_bfloat16));  // y
  const bool may_overlap = strategy == Strategy::TileSignal || strategy == Strategy::Auto;
  f.add(ExpertFfn::device_bytes(c, local_experts, layout.receive_capacity, options.gemm));
  // the planned GEMMs and the device exchange walk the step's device-built plan
  const plan_detail::SequentialShape plan_shape = plan_detail::gpu_sequential_shape(c, 0, c.tokens, volume);
  plan_detail::PlanCapacity plan_room;
  int extra_prefix = 0;
  if (strategy == Strategy::Comet) {  // comet's room alone: it runs no other strategy
    const std::int64_t split = comet_gpu_split_cols(c.hidden, options.comet);
    const plan_detail::CometShape comet_shape = plan_detail::gpu_comet_shape(c, 0, c.tokens, volume, split);
    plan_room = plan_detail::comet_capacity(world, static_cast<int>(local_experts), layout.receive_capacity, c.tokens, comet_shape);
    extra_prefix = comet_device_prefix(world, static_cast<int>(local_experts), plan_detail::comet_splits(comet_shape));
    f.add(static_cast<std::size_t>(plan_detail::comet_splits(comet_shape)), sizeof(unsigned));  // split_flags
  } else {  // tile_signal's room holds the sequential one; auto may end up either: room for both, table by table
    plan_room = plan_detail::sequential_capacity(world, static_cast<int>(local_experts), layout.receive_capacity, c.tokens, plan_shape);
    if (may_overlap) {
      const plan_detail::PlanCapacity overlap_room =
          plan_detail::tile_signal_capacity(world, static_cast<int>(local_experts), layout.receive_capacity, c.tokens, plan_shape);
      for (std::size_t t = 0; t < plan_room.entries.size(); ++t) plan_room.entries[t] = std::max(plan_room.entries[t], overlap_room.entries[t]);
    }
  }
  const bool walks_plan = options.gemm == GemmPath::Planned || (options.dispatch == DispatchPath::Device && !direct);
  if (walks_plan) f.add(DevicePlanTables::device_bytes(plan_room, world, static_cast<int>(c.num_experts), extra_prefix));
  const auto band_room = static_cast<std::size_t>(
      plan_detail::tile_signal_max_bands(layout.receive_capacity, static_cast<int>(local_experts), plan_shape.tile_m) + 1);
  if (may_overlap) f.add(band_room, sizeof(unsigned));  // band_flags
  if (shared_expert_ffn > 0) f.add(SharedExpertFfn::device_bytes(c, shared_expert_ffn, c.tokens));
  if (options.record_trace) {
    f.add(4 * static_cast<std::size_t>(plan_room.entries[plan_detail::kTilesTable]), sizeof(unsigned long long));  // gemm*_tile_times
    if (may_overlap) f.add(3 * band_room, sizeof(unsigned long long));                                              // unit_times
  }
  return f.bytes();
}

void EpMoeLayer::Impl::init(const MoeConfig& c, RankTransport& t, EpMoeLayerOptions o, EpMoeLayerHarness h) {
  validate_cuda_layer(c);
  if (c.router.scales_input && o.dispatch == DispatchPath::Host) {
    throw_bad_input("the experts' input scaled by the routing weight (Llama-4's) runs on the device dispatch path only: use --dispatch device");
  }
  config = c;
  transport = &t;
  options = o;
  harness = h;
  world = t.world_size();
  rank = t.rank();
  device = t.device();
  if (o.strategy == Strategy::Comet && world == 1) split_note = "comet: a world of one has no communication";
  o.strategy = world_strategy(o, world);
  options.strategy = o.strategy;
  if (o.strategy == Strategy::Comet) {
    if (o.dispatch != DispatchPath::Device || o.gemm != GemmPath::Planned) {
      throw_bad_input("comet on the GPU needs the device dispatch path and the planned GEMM (its tiles wait for their rows)");
    }
    if (t.device_view().gin_comm != nullptr) throw_bad_input("comet does not reach GIN peers (other nodes) yet: use the sequential strategy");
    if (c.router.scales_input) {
      throw_bad_input("the experts' input scaled by the routing weight (Llama-4's) runs with sequential or tile_signal: comet's GEMM0 "
                      "starts before every row is in");
    }
    if (h.identity_experts) throw_bad_input("identity experts run the sequential strategy only");
  }
  if (c.num_experts % world != 0) {
    throw_bad_input(std::to_string(c.num_experts) + " experts do not divide evenly over " + std::to_string(world) + " ranks");
  }
  local_experts = static_cast<int>(c.num_experts / world);
  remote_peers = t.device_view().gin_comm != nullptr;
  if (remote_peers && h.identity_experts) throw_bad_input("identity experts (an exchange benchmark) need a load/store world");
  volume = resolved_dispatch_volume(o, world, remote_peers);
  layout = ep_region_layout(world, c.num_experts, c.hidden, c.tokens, c.top_k, remote_peers, o.receive_rows, volume,
                            c.router.scales_input, segment_flags_of(c, world, o));
  if (t.region_bytes() < layout.bytes) {
    throw_bad_input("the world's symmetric regions hold " + std::to_string(t.region_bytes()) + " bytes; this layer needs " +
                    std::to_string(layout.bytes) + " (EpMoeLayer::region_bytes" + (remote_peers ? ", with remote peers)" : ")"));
  }
  if (layout.receive_capacity > INT_MAX / 2 || c.tokens * c.top_k > INT_MAX / 2) {
    throw_bad_input("too many rows per rank for the exchange: " + std::to_string(layout.receive_capacity));
  }
  use_device(device);

  const int sharing = t.ranks_sharing_sms();
  if (t.ranks_per_device() > 1 && lazy_module_loading()) {
    throw_bad_input("ranks sharing a GPU need CUDA_MODULE_LOADING=EAGER in the environment (before CUDA starts): with lazy "
                    "loading a kernel's first launch can wait for the peers' kernels that wait for it");
  }
  ExchangeShape exchange_shape;
  exchange_shape.world = world;
  exchange_shape.sm_count = t.sm_count();
  exchange_shape.sharing = sharing;
  exchange_shape.resident_ctas_per_sm = segment_copy_ctas_per_sm();
  // comet's exchange runs on a few CTAs serving every peer (CometOptions::dispatch_ctas, send_ctas), one raise per segment
  if (o.strategy == Strategy::Comet && o.exchange_ctas_per_peer > 1) {
    throw_bad_input("comet sizes its exchange by CometOptions::dispatch_ctas and send_ctas (CTAs serving every peer): leave "
                    "exchange_ctas_per_peer at 0, not " + std::to_string(o.exchange_ctas_per_peer));
  }
  ctas_per_peer = choose_exchange_ctas_per_peer(exchange_shape, o.strategy == Strategy::Comet ? 1 : o.exchange_ctas_per_peer);

  own = t.stream(RankStream::Setup);
  const std::int64_t E = c.num_experts, H = c.hidden;
  const auto slots = static_cast<std::size_t>(c.tokens * c.top_k);
  const std::size_t slot_room = std::max<std::size_t>(slots, 1);
  allocate(c);
  // a world of one runs sequential (auto too: nothing to overlap) and needs no send buffer
  direct = world == 1 && !remote_peers && o.dispatch == DispatchPath::Device && o.strategy != Strategy::TileSignal &&
           !h.silent && !h.silent_rows && !h.identity_experts && !o.record_trace;
  if (!remote_peers && !direct && !once_per_rank()) send_rows = DeviceArray<__nv_bfloat16>(slot_room * static_cast<std::size_t>(H));
  if (c.router.scales_input) {
    const std::vector<float> one(slot_room, 1.0f);
    ones = DeviceArray<float>(one.data(), one.size());
  }
  if (once_per_rank()) {
    rank_tokens = DeviceArray<int>(static_cast<std::size_t>(world));
    list_position = DeviceArray<int>(static_cast<std::size_t>(std::max<std::int64_t>(c.tokens, 1) * world));
  }
  const auto receive_room = static_cast<std::size_t>(std::max<std::int64_t>(layout.receive_capacity, 1));
  epoch = DeviceArray<std::uint64_t>(1);
  local_row_offset = DeviceArray<int>(static_cast<std::size_t>(local_experts + 1));
  TILEMOE_CUDA_CHECK(cudaMemsetAsync(epoch.data(), 0, sizeof(std::uint64_t), own));
  // zero rows until the first dispatch writes real tables
  TILEMOE_CUDA_CHECK(cudaMemsetAsync(local_row_offset.data(), 0, local_row_offset.count() * sizeof(int), own));
  if (o.dispatch == DispatchPath::Host) {
    gathered = DeviceArray<int>(static_cast<std::size_t>(world * (E + 1)));
    block_tables = DeviceArray<int>(static_cast<std::size_t>(2 * 3 * E));
    staging = DeviceArray<__nv_bfloat16>(std::max(receive_room, slot_room) * static_cast<std::size_t>(H));
    host_gathered = std::make_unique<PinnedArray<int>>(static_cast<std::size_t>(world * (E + 1)));
    host_tables = std::make_unique<PinnedArray<int>>(static_cast<std::size_t>(2 * 3 * E + local_experts + 1));
  }
  // the device exchange runs the step's plan: the sequential one, unless tile_signal compiles its own
  exchange_walks_plan = o.dispatch == DispatchPath::Device && !direct;
  if (h.unrunnable_dispatch_segment && !exchange_walks_plan) {
    throw_bad_input("unrunnable_dispatch_segment corrupts the plan of the device exchange, which this layer does not run");
  }
  unrunnable_flag = layout.segment_flag_count;
  auto build_sequential_plan = [&] {
    device_plan = std::make_unique<DevicePlanTables>(
        plan_detail::sequential_capacity(world, local_experts, layout.receive_capacity, c.tokens, device_plan_shape(c.tokens)),
        world, static_cast<int>(E));
  };
  if (h.identity_experts) {
    if (o.strategy == Strategy::TileSignal) throw_bad_input("identity experts run the sequential strategy only");
    options.strategy = Strategy::Sequential;
    agree_on_settings(false);
    if (exchange_walks_plan || h.build_device_plan) build_sequential_plan();
    return;
  }
  if (!remote_peers) y = DeviceArray<__nv_bfloat16>(receive_room * static_cast<std::size_t>(H));
  const double rows_per_expert = static_cast<double>(world) * static_cast<double>(slots) / static_cast<double>(E);
  ExpertFfnOptions ffn_options;
  // tile_signal needs the device dispatch, the planned GEMM's flags and load/store peers; auto
  // runs sequential where those are missing
  const bool can_overlap = o.dispatch == DispatchPath::Device && o.gemm == GemmPath::Planned && !remote_peers && world > 1;
  TileSignalGpuShape shape;
  shape.tokens = c.tokens;
  shape.top_k = c.top_k;
  shape.hidden = c.hidden;
  shape.ffn_hidden = c.ffn_hidden;
  shape.world = world;
  shape.sm_count = t.sm_count();
  shape.sharing = sharing;
  shape.resident_exchange_ctas = exchange_shape.resident_ctas_per_sm * t.sm_count();
  shape.link_bytes_per_s = t.link_bytes_per_s();
  bool split_chosen_here = false;
  if (o.strategy == Strategy::Auto && !can_overlap) {
    options.strategy = Strategy::Sequential;
    split_note = remote_peers ? "auto: sequential (peers on other nodes)"
                 : world == 1 ? "auto: sequential (a world of one has no communication)"
                              : "auto: sequential (this path cannot overlap)";
  } else if (o.strategy == Strategy::Auto || o.strategy == Strategy::TileSignal) {
    const int dev = device;
    const TileSignalSplit split = choose_tile_signal_split(shape, o.tile_signal, o.strategy == Strategy::Auto,
                                                           [dev]() -> const GpuRates& { return gpu_rates(dev); });
    options.strategy = split.overlap ? Strategy::TileSignal : Strategy::Sequential;
    options.tile_signal.consumer_ctas = split.consumer_ctas;
    split_note = split.note;
    split_chosen_here = split.chosen_by_model;
  }
  if (options.strategy == Strategy::Comet) {
    CometGpuShape comet_shape;
    comet_shape.tokens = c.tokens;
    comet_shape.hidden = c.hidden;
    comet_shape.ffn_hidden = c.ffn_hidden;
    comet_shape.experts = c.num_experts;
    comet_shape.top_k = c.top_k;
    comet_shape.world = world;
    comet_shape.once_per_rank = once_per_rank();
    comet_shape.sm_count = t.sm_count();
    comet_shape.sharing = sharing;
    comet_shape.sequential_ctas_per_peer = choose_exchange_ctas_per_peer(exchange_shape, 0);  // the model's baseline
    comet_shape.link_bytes_per_s = t.link_bytes_per_s();
    const int dev = device;
    comet = comet_gpu_schedule(comet_shape, o.comet, [dev]() -> const GpuRates& { return gpu_rates(dev); });
    split_note = comet.note;
  }
  agree_on_settings(split_chosen_here);
  ffn_walks_plan = o.gemm == GemmPath::Planned;  // on whichever strategy the layer runs
  if (options.strategy == Strategy::Comet) {
    ffn_options.gemm0_sm_limit = comet.gemm0_sm_limit;
    ffn_options.gemm1_sm_limit = comet.gemm1_sm_limit;
    const plan_detail::CometShape plan_shape = comet_plan_shape(c.tokens);
    device_plan = std::make_unique<DevicePlanTables>(
        plan_detail::comet_capacity(world, local_experts, layout.receive_capacity, c.tokens, plan_shape), world, static_cast<int>(E),
        comet_device_prefix(world, local_experts, plan_detail::comet_splits(plan_shape)));
    split_flags = DeviceArray<unsigned>(static_cast<std::size_t>(plan_detail::comet_splits(plan_shape)));
    consumer = t.stream(RankStream::Consumer);  // the dispatch beside GEMM0, the splits' sends beside GEMM1
    // the combine, after this rank's sends, waits for each split from the others: sized as tile_signal's arrival combine (below)
    combine_ctas = sharing > 1 ? ctas_per_peer * world : plan_combine_ctas_per_sm() * t.sm_count();
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  } else if (options.strategy == Strategy::TileSignal) {
    if (o.dispatch != DispatchPath::Device || o.gemm != GemmPath::Planned) {
      throw_bad_input("tile_signal needs the device dispatch path and the planned GEMM");
    }
    if (remote_peers) throw_bad_input("tile_signal does not reach GIN peers (other nodes) yet: use the sequential strategy");
    if (h.build_device_plan) throw_bad_input("build_device_plan builds the sequential plan; tile_signal compiles its own");
    schedule = tile_signal_gpu_schedule(shape, options.tile_signal, options.tile_signal.consumer_ctas);
    ffn_options.gemm1_sm_limit = schedule.gemm1_sm_limit;
    device_plan = std::make_unique<DevicePlanTables>(
        plan_detail::tile_signal_capacity(world, local_experts, layout.receive_capacity, c.tokens, device_plan_shape(c.tokens)),
        world, static_cast<int>(E));
    // a flag per band of the most rows a step may bring, and one more that no tile raises (the
    // corrupted wait of harness.unsignalled_band_wait)
    const std::int64_t band_room = plan_detail::tile_signal_max_bands(layout.receive_capacity, local_experts, kPlannedTileM) + 1;
    band_flags = DeviceArray<unsigned>(static_cast<std::size_t>(band_room));
    unsignalled_flag = static_cast<int>(band_flag() + band_room - 1);
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(band_flags.data(), 0, band_flags.count() * sizeof(unsigned), own));
    consumer = t.stream(RankStream::Consumer);  // high priority
    // ranks sharing SMs: the grid of the combine send it replaces, which fits beside every
    // sharing rank's waiting exchange kernels; otherwise the rank's SMs full (the combine is
    // memory-bound, and its waits are for consumers already resident)
    combine_ctas = sharing > 1 ? ctas_per_peer * world : arrival_combine_ctas_per_sm() * t.sm_count();
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    TILEMOE_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  } else if (ffn_walks_plan || exchange_walks_plan || h.build_device_plan) {
    build_sequential_plan();
  }
  if (ffn_walks_plan) ffn_options.plan = device_plan->view();
  ffn = std::make_unique<ExpertFfn>(c, static_cast<std::int64_t>(rank) * local_experts, local_experts,
                                    layout.receive_capacity, rows_per_expert, o.gemm, device, ffn_options);

  if (o.record_trace) {
    if (o.gemm != GemmPath::Planned) throw_bad_input("device traces need the planned GEMM (its tile times)");
    const std::size_t entries = device_plan->capacity().entries[plan_detail::kTilesTable];
    gemm0_tile_times = DeviceArray<unsigned long long>(2 * std::max<std::size_t>(entries, 1));
    gemm1_tile_times = DeviceArray<unsigned long long>(2 * std::max<std::size_t>(entries, 1));
    if (options.strategy == Strategy::TileSignal) unit_times = DeviceArray<unsigned long long>(3 * band_flags.count());
  }
}

// Every rank must run the same exchange: the arrival targets count the peers' CTAs as this
// rank's, and the region offsets follow from the shape. A split the cost model chose is rank
// 0's (processes calibrate their own GPUs and could pick differently at a boundary); the rest
// must match, or every rank refuses with the same message.
void EpMoeLayer::Impl::agree_on_settings(bool split_chosen_here) {
  enum : std::size_t { kCtasPerPeer, kConsumerCtas, kStrategy, kChosen, kCapacity, kTokens, kHidden, kTopK, kExperts, kVolume, kSplit, kCount };
  int mine[kCount] = {};
  mine[kCtasPerPeer] = ctas_per_peer;
  mine[kConsumerCtas] = options.tile_signal.consumer_ctas;
  mine[kStrategy] = static_cast<int>(options.strategy);
  mine[kChosen] = split_chosen_here ? 1 : 0;
  mine[kCapacity] = static_cast<int>(layout.receive_capacity);
  mine[kTokens] = static_cast<int>(config.tokens);
  mine[kHidden] = static_cast<int>(config.hidden);
  mine[kTopK] = static_cast<int>(config.top_k);
  mine[kExperts] = static_cast<int>(config.num_experts);
  mine[kVolume] = static_cast<int>(volume);
  mine[kSplit] = static_cast<int>(comet.split_cols);
  std::vector<int> all(kCount * static_cast<std::size_t>(world));
  {  // freed before any peer waits on this rank's kernels: cudaFree waits for the whole device
    DeviceArray<int> sent(kCount), gathered(all.size());
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(sent.data(), mine, sizeof mine, cudaMemcpyHostToDevice, own));  // ordered with the gather
    transport->host_exchange().all_gather(own, sent.data(), static_cast<int>(kCount), gathered.data());
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(all.data(), gathered.data(), all.size() * sizeof(int), cudaMemcpyDeviceToHost, own));
    transport->synchronize(own, "the ranks' exchange settings");
  }
  auto of = [&](int q, std::size_t field) { return all[static_cast<std::size_t>(q) * kCount + field]; };
  if (of(0, kChosen) != mine[kChosen]) {
    throw_bad_input("rank 0 and rank " + std::to_string(rank) + " disagree on whether the cost model picks the SM split: " +
                    "give every rank the same strategy and consumer_ctas");
  }
  if (split_chosen_here && rank != 0) {
    options.strategy = static_cast<Strategy>(of(0, kStrategy));
    options.tile_signal.consumer_ctas = of(0, kConsumerCtas);
    if (of(0, kStrategy) != mine[kStrategy] || of(0, kConsumerCtas) != mine[kConsumerCtas]) split_note += "; rank 0's pick";
    mine[kStrategy] = of(0, kStrategy);
    mine[kConsumerCtas] = of(0, kConsumerCtas);
  }
  static const char* const names[kCount] = {"exchange CTAs per peer", "consumer CTAs", "strategy", "", "receive rows",
                                            "tokens", "hidden", "top-k", "experts", "dispatch volume", "comet split columns"};
  for (int q = 0; q < world; ++q) {
    for (std::size_t f = 0; f < kCount; ++f) {
      if (f == kChosen) continue;
      const int theirs = (split_chosen_here && (f == kStrategy || f == kConsumerCtas)) ? of(0, f) : of(q, f);
      if (theirs != mine[f]) {
        throw_bad_input("rank " + std::to_string(q) + " runs " + std::to_string(theirs) + " " + names[f] + ", rank " +
                        std::to_string(rank) + " " + std::to_string(mine[f]) +
                        ": every rank needs the same layer shape and exchange settings (set exchange_ctas_per_peer, "
                        "consumer_ctas and receive_rows explicitly where GPUs differ)");
      }
    }
  }
}

// This rank's region starts from a clean slate (flags at 0, no failure), then the world meets:
// nobody writes into a peer's region before that peer has cleared it.
void EpMoeLayer::Impl::finish_init() {
  TILEMOE_CUDA_CHECK(cudaMemsetAsync(region(0), 0, layout.dispatch_rows, own));
  if (remote_peers) launch_reset_gin_signals(own, transport->device_view());  // a previous layer's counts
  wait_for_own("clearing the rank's region");
  transport->host_barrier();
}

EpMoeLayer::EpMoeLayer(const MoeConfig& layer, const ExpertWeights& weights, RankTransport& transport, EpMoeLayerOptions options,
                       EpMoeLayerHarness harness)
    : impl_(std::make_unique<Impl>()) {
  check_weights_match(weights, layer);
  impl_->init(layer, transport, options, harness);
  if (impl_->ffn) impl_->ffn->upload(weights);
  if (weights.shared) impl_->shared = std::make_unique<SharedExpertFfn>(layer, *weights.shared, layer.tokens, impl_->device);
  impl_->finish_init();
}

EpMoeLayer::EpMoeLayer(const MoeConfig& layer, RandomDeviceWeights weights, RankTransport& transport, EpMoeLayerOptions options,
                       EpMoeLayerHarness harness)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(layer, transport, options, harness);
  if (impl_->ffn) impl_->ffn->draw(weights.seed);
  impl_->finish_init();
}

EpMoeLayer::~EpMoeLayer() = default;

const MoeConfig& EpMoeLayer::config() const { return impl_->config; }
int EpMoeLayer::exchange_ctas_per_peer() const { return impl_->ctas_per_peer; }
Strategy EpMoeLayer::strategy() const { return impl_->options.strategy; }
int EpMoeLayer::consumer_ctas() const {
  return impl_->options.strategy == Strategy::TileSignal ? impl_->schedule.consumer_ctas : 0;
}

std::string EpMoeLayer::description() const {
  const Impl& m = *impl_;
  std::string text = std::string(strategy_name(m.options.strategy)) + ", " + dispatch_path_name(m.options.dispatch) + " dispatch";
  if (m.direct) {
    text += ", a world of one: no exchange copies";
  } else if (m.options.dispatch == DispatchPath::Device) {
    text += (m.is_comet() ? std::string() : ", " + std::to_string(m.ctas_per_peer) + " CTAs per peer") + ", " +
            (m.once_per_rank() ? "a token once per destination rank" : "a row per expert");
  }
  if (m.options.strategy == Strategy::TileSignal) {
    const bool unblocked = static_cast<std::size_t>(m.schedule.band_block) + 1 >= m.band_flags.count();  // no expert has that many bands
    text += ", consumer " + std::to_string(m.schedule.consumer_ctas) + " CTAs x " + std::to_string(m.schedule.bands_per_segment) +
            " band(s), GEMM1 " +
            (unblocked ? std::string("in the sequential tile order") : "in blocks of " + std::to_string(m.schedule.band_block) + " bands") +
            ", tokens combined as they land (" + std::to_string(m.combine_ctas) + " CTAs)";
  }
  if (!m.split_note.empty()) text += " (" + m.split_note + ")";
  return text + ", " + (m.ffn ? m.ffn->description() : std::string("identity experts"));
}

EpExchangeArgs EpMoeLayer::Impl::exchange_args() const {
  EpExchangeArgs a;
  a.layout = layout;
  a.tables = {epoch.data(), local_row_offset.data()};
  a.experts = static_cast<int>(config.num_experts);
  a.local_experts = local_experts;
  a.hidden = static_cast<int>(config.hidden);
  a.row_offset = row_offset.data();
  a.rank_tokens = once_per_rank() ? rank_tokens.data() : nullptr;
  a.expert_out = expert_out();
  a.silent = harness.silent;
  return a;
}

SegmentCopyArgs EpMoeLayer::Impl::segment_args(SegmentDrain drain, int first, int count, const __nv_bfloat16* input,
                                               int tokens) const {
  SegmentCopyArgs a;
  a.layout = layout;
  a.epoch = epoch.data();
  a.plan = device_plan->view();
  a.first_segment = first;
  a.segment_count = count;
  const std::int64_t slots = config.tokens * config.top_k;
  // Input: gathered through the plan's gather table with a dispatch once per rank, else its
  // permuted copy (the layout's permute applied the gather); ExpertIn, Received and CombineIn
  // are written at their owners' regions
  if (once_per_rank()) {
    a.buffers[static_cast<int>(BufferId::Input)] = {reinterpret_cast<const std::byte*>(input), 0, tokens};
    a.buffers[static_cast<int>(BufferId::Received)] = {region(layout.received_rows), layout.received_rows, layout.received_capacity};
    a.gather_rows = reinterpret_cast<const int*>(region(layout.gather_rows));
    a.gather_room = layout.gather_room;
  } else {
    a.buffers[static_cast<int>(BufferId::Input)] = {reinterpret_cast<const std::byte*>(send_rows_ptr()), 0, slots};
  }
  a.buffers[static_cast<int>(BufferId::ExpertIn)] = {nullptr, layout.dispatch_rows, layout.receive_capacity};
  a.buffers[static_cast<int>(BufferId::ExpertOut)] = {expert_out(), 0, layout.receive_capacity};
  a.buffers[static_cast<int>(BufferId::CombineIn)] = {nullptr, layout.returned_rows, slots};
  a.hidden = static_cast<int>(config.hidden);
  a.ctas_per_peer = ctas_per_peer;
  a.drain = drain;
  a.silent = harness.silent || harness.silent_rows;
  return a;
}

// The host path's dispatch: every rank's counts to the host, then one all-to-all of known
// sizes into source-major staging, then the (expert, source) blocks reordered into the same
// rows the device path writes.
void EpMoeLayer::Impl::host_dispatch(cudaStream_t stream, int /*tokens*/) {
  const int N = world, E = static_cast<int>(config.num_experts), L = local_experts, me = rank;
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * 2;
  HostExchange& exchange = transport->host_exchange();
  exchange.all_gather(stream, row_offset.data(), E + 1, gathered.data());
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(host_gathered->data(), gathered.data(), static_cast<std::size_t>(N * (E + 1)) * sizeof(int),
                                     cudaMemcpyDeviceToHost, stream));
  transport->synchronize(stream, "the gathered dispatch counts");  // the host sync on counts that defines this path
  const PinnedArray<int>& g = *host_gathered;
  auto offset_of = [&](int q, int x) { return g[static_cast<std::size_t>(q * (E + 1) + x)]; };
  auto count_of = [&](int q, int x) { return offset_of(q, x + 1) - offset_of(q, x); };
  send_offset.assign(static_cast<std::size_t>(N), 0);
  send_bytes.assign(static_cast<std::size_t>(N), 0);
  recv_offset.assign(static_cast<std::size_t>(N), 0);
  recv_bytes.assign(static_cast<std::size_t>(N), 0);
  std::size_t received = 0;
  for (int p = 0; p < N; ++p) {
    const auto pi = static_cast<std::size_t>(p);
    send_offset[pi] = static_cast<std::size_t>(offset_of(me, p * L)) * row_bytes;
    send_bytes[pi] = static_cast<std::size_t>(offset_of(me, (p + 1) * L) - offset_of(me, p * L)) * row_bytes;
    const int rows = offset_of(p, (me + 1) * L) - offset_of(p, me * L);
    recv_offset[pi] = received * row_bytes;
    recv_bytes[pi] = static_cast<std::size_t>(rows) * row_bytes;
    received += static_cast<std::size_t>(rows);
  }
  // every rank checks every destination on the same gathered counts: all refuse together,
  // before any row moves
  for (int p = 0; p < N; ++p) {
    std::int64_t rows = 0;
    for (int q = 0; q < N; ++q) rows += offset_of(q, (p + 1) * L) - offset_of(q, p * L);
    if (rows > layout.receive_capacity) {
      comm::WaitFailure f;
      f.state = static_cast<std::uint32_t>(comm::WaitState::CapacityExceeded);
      f.rank = me;
      f.peer = p;
      f.expected = static_cast<std::uint64_t>(layout.receive_capacity);
      f.seen = static_cast<std::uint64_t>(rows);
      throw_bad_input(comm::describe(f));
    }
  }
  // tables: [0] staging -> dispatch rows, [1] the way back; block b = le * N + q in both
  int* t = host_tables->data();
  const int blocks = L * N;
  int* forward_src = t;
  int* forward_dst = t + blocks;
  int* rows = t + 2 * blocks;
  int* local_offsets = t + 6 * blocks;
  int dst = 0;
  for (int le = 0; le < L; ++le) {
    local_offsets[le] = dst;
    for (int q = 0; q < N; ++q) {
      const int b = le * N + q;
      int src = static_cast<int>(recv_offset[static_cast<std::size_t>(q)] / row_bytes);
      for (int l = 0; l < le; ++l) src += count_of(q, me * L + l);
      forward_src[b] = src;
      forward_dst[b] = dst;
      rows[b] = count_of(q, me * L + le);
      dst += rows[b];
    }
  }
  local_offsets[L] = dst;
  std::copy(forward_dst, forward_dst + blocks, t + 3 * blocks);  // back: dispatch rows -> staging
  std::copy(forward_src, forward_src + blocks, t + 4 * blocks);
  std::copy(rows, rows + blocks, t + 5 * blocks);
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(block_tables.data(), t, static_cast<std::size_t>(6 * blocks) * sizeof(int),
                                     cudaMemcpyHostToDevice, stream));
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(local_row_offset.data(), local_offsets, static_cast<std::size_t>(L + 1) * sizeof(int),
                                     cudaMemcpyHostToDevice, stream));
  exchange.all_to_all(stream, send_rows_ptr(), send_offset, send_bytes, staging.data(), recv_offset, recv_bytes);
  launch_copy_row_blocks(stream, reinterpret_cast<const std::byte*>(staging.data()), region(layout.dispatch_rows),
                         static_cast<int>(row_bytes), block_tables.data(), blocks);
}

void EpMoeLayer::Impl::host_combine_send(cudaStream_t stream) {
  const int blocks = local_experts * world;
  launch_copy_row_blocks(stream, expert_out(), reinterpret_cast<std::byte*>(staging.data()),
                         static_cast<int>(config.hidden) * 2, block_tables.data() + 3 * blocks, blocks);
  // the way back: what came from q returns to q, at the place its own permuted order keeps it
  transport->host_exchange().all_to_all(stream, staging.data(), recv_offset, recv_bytes, region(layout.returned_rows),
                                        send_offset, send_bytes);
}

void EpMoeLayer::forward(cudaStream_t stream, const __nv_bfloat16* input, const float* router_logits, __nv_bfloat16* output,
                         std::int64_t tokens, const EpStageEvents* events) {
  Impl& m = *impl_;
  const MoeConfig& c = m.config;
  if (m.failed) throw_bad_input("rank " + std::to_string(m.rank) + ": a previous step of this layer failed; build a new world");
  if (tokens < 0 || tokens > c.tokens) {
    throw_bad_input("forward of " + std::to_string(tokens) + " tokens on a layer sized for " + std::to_string(c.tokens));
  }
  for (const void* p : {static_cast<const void*>(input), static_cast<const void*>(output)}) {
    if (tokens > 0 && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) throw_bad_input("input and output must be 16-byte aligned");
  }
  use_device(m.device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TILEMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone && m.options.dispatch == DispatchPath::Host) {
    throw_bad_input("the host dispatch path synchronises with the host and cannot be captured in a CUDA graph");
  }
  // ranks sharing a GPU run on their world's streams only (RankStream says why)
  if (m.transport->ranks_per_device() > 1 && stream != m.transport->stream(RankStream::Main)) {
    throw_bad_input("ranks sharing a GPU run their steps on the world's stream: pass RankTransport::stream(RankStream::Main) "
                    "(another stream can share a hardware queue with a peer's waiting kernel and stall both)");
  }
  if (tokens > 0 && router_logits == nullptr && m.gate.count() == 0) {
    throw_bad_input("forward without router logits needs the router's gate: call set_router_gate, or pass the logits");
  }

  const int T = static_cast<int>(tokens), k = static_cast<int>(c.top_k);
  const int H = static_cast<int>(c.hidden), slots = T * k;
  auto mark = [&](int stage) {
    if (events) TILEMOE_CUDA_CHECK(cudaEventRecord(events->boundary[stage], stream));
  };
  try {
    mark(kEpRouter);
    m.launch_router(stream, input, router_logits, T, c);
    mark(kEpLayout);
    m.launch_layout(stream, T, c);
    mark(kEpPermute);
    if (m.direct && slots > m.layout.receive_capacity) {
      throw_bad_input("a step of " + std::to_string(slots) + " rows exceeds the receive capacity of " +
                      std::to_string(m.layout.receive_capacity) + " rows: raise EpMoeLayerOptions::receive_rows");
    }
    const DeviceTransport& view = m.transport->device_view();
    if (m.once_per_rank()) {  // the segments gather from the input: the lists instead of a permuted copy
      SendListArgs lists;
      lists.expert = m.expert.data();
      lists.slot_of_row = m.slot_of_row.data();
      lists.row_of_slot = m.row_of_slot.data();
      lists.kept_rows = m.row_offset.data() + c.num_experts;
      lists.tokens = T;
      lists.top_k = k;
      lists.local_experts = m.local_experts;
      lists.rank_tokens = m.rank_tokens.data();
      lists.list_position = m.list_position.data();
      lists.gather_rows = reinterpret_cast<int*>(m.region(m.layout.gather_rows));
      lists.gather_room = m.layout.gather_room;
      launch_send_lists(stream, view, lists);
    } else {
      auto* expert_rows = m.direct ? reinterpret_cast<__nv_bfloat16*>(m.region(m.layout.dispatch_rows)) : m.send_rows_ptr();
      launch_permute(stream, input, H, k, m.slot_of_row.data(), slots, expert_rows);
    }
    mark(kEpDispatch);
    const EpExchangeArgs args = m.exchange_args();
    const bool scales_input = c.router.scales_input;
    if (m.direct) {  // the permuted rows are the expert rows: only the offsets move
      TILEMOE_CUDA_CHECK(cudaMemcpyAsync(m.local_row_offset.data(), m.row_offset.data(), m.local_row_offset.count() * sizeof(int),
                                         cudaMemcpyDeviceToDevice, stream));
      if (scales_input) {  // a world of one: its offsets are every rank's, its ExpertIn rows its permuted rows
        const int E = static_cast<int>(c.num_experts);
        const InputScaleArgs scales = m.input_scale_args(plan_detail::StepCounts{1, E, E, m.row_offset.data(), m.row_offset.data()}, T);
        launch_write_input_scales(stream, view, scales);
        launch_scale_expert_rows(stream, view, scales);
      }
    } else if (m.exchange_walks_plan) {
      launch_ep_begin_step(stream, m.epoch.data());
      launch_ep_exchange_counts(stream, view, args);
    } else {
      m.host_dispatch(stream, T);
    }
    const bool overlap = m.options.strategy == Strategy::TileSignal;
    const int dispatch_segments = m.dispatch_segments();
    if (m.device_plan) {  // from the counts this step exchanged
      const int* counts = m.exchange_walks_plan ? reinterpret_cast<const int*>(m.region(m.layout.counts_inbox)) : nullptr;
      const int* offsets = m.direct ? m.row_offset.data() : m.gathered.data();
      const int* rank_tokens = m.once_per_rank() ? reinterpret_cast<const int*>(m.region(m.layout.rank_tokens_inbox)) : nullptr;
      if (m.is_comet()) {
        launch_compile_comet(stream, counts, rank_tokens, m.comet_plan_shape(T), *m.device_plan);
      } else if (overlap) {
        launch_compile_tile_signal(stream, counts, rank_tokens, m.tile_signal_plan_shape(T), *m.device_plan);
        if (m.harness.unsignalled_band_wait) {  // the first band wait names the flag no tile raises
          // after the dispatch's waits and GEMM0's (tile_signal_plan.hpp), which a rank with rows
          // has: on a rank without rows this lands past the waits in use and corrupts nothing
          const int band_wait = m.world + 1;
          TILEMOE_CUDA_CHECK(cudaMemcpyAsync(&m.device_plan->waits()[band_wait].flag, &m.unsignalled_flag, sizeof(int),
                                             cudaMemcpyHostToDevice, stream));
        }
      } else {
        launch_compile_sequential(stream, counts, offsets, rank_tokens, m.device_plan_shape(T), *m.device_plan);
      }
      m.device_plan_tokens = T;
      if (m.once_per_rank()) {  // where this rank's tokens land at their destinations, before the rows go
        PlacementArgs placements;
        placements.layout = m.layout;
        placements.counts = plan_detail::StepCounts{m.world, static_cast<int>(c.num_experts), m.local_experts, m.device_plan->offset(),
                                                    m.device_plan->rank_row(), rank_tokens};
        // the plan's ExpertIn: comet's sources in ring order, sequential's and tile_signal's ascending
        placements.order = m.is_comet() ? plan_detail::DispatchOrder::Ring : plan_detail::DispatchOrder::Ascending;
        placements.expert = m.expert.data();
        placements.slot_of_row = m.slot_of_row.data();
        placements.list_position = m.list_position.data();
        placements.tokens = T;
        placements.top_k = k;
        placements.epoch = m.epoch.data();
        launch_write_placements(stream, view, placements);
      }
      if (m.harness.unrunnable_dispatch_segment) {
        TILEMOE_CUDA_CHECK(cudaMemcpyAsync(&m.device_plan->segments()[0].dest_flag, &m.unrunnable_flag, sizeof(int),
                                           cudaMemcpyHostToDevice, stream));
      }
    }
    if (m.exchange_walks_plan) {
      const InputScaleArgs scales = m.input_scale_args(
          plan_detail::StepCounts{m.world, static_cast<int>(c.num_experts), m.local_experts, m.device_plan->offset(), m.device_plan->rank_row()},
          T);
      if (scales_input) launch_write_input_scales(stream, view, scales);  // with the rows' release, below
      if (m.is_comet()) {  // beside GEMM0, whose tiles wait for their rows: forked off here; the splits' sends follow it there
        TILEMOE_CUDA_CHECK(cudaEventRecord(m.fork, stream));
        TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(m.consumer, m.fork, 0));
        SegmentCopyArgs dispatch = m.segment_args(SegmentDrain::None, 0, dispatch_segments, input, T);
        dispatch.serial_sends = m.comet.serial_sends;
        dispatch.packed_ctas = m.comet.dispatch_ctas;
        launch_segment_copy(m.consumer, view, dispatch);
        TILEMOE_CUDA_CHECK(cudaEventRecord(m.join, m.consumer));
      } else {
        launch_segment_copy(stream, view, m.segment_args(SegmentDrain::GemmTiles, 0, dispatch_segments, input, T));
      }
      if (scales_input) launch_scale_expert_rows(stream, view, scales);   // every row is in
    }
    if (m.ffn) {
      const auto* rows = reinterpret_cast<const __nv_bfloat16*>(m.region(m.layout.dispatch_rows));
      const std::int64_t bound = m.layout.receive_capacity;
      mark(kEpGemm0);
      PlannedTileWaits tile_waits;  // comet's GEMM0 tiles wait for their sources' rows in the GEMM
      if (m.is_comet()) {
        tile_waits.transport = view;
        tile_waits.counters = m.layout.segment_flags;
        tile_waits.counter_flags = static_cast<std::uint32_t>(m.layout.segment_flag_count);
        tile_waits.epoch = m.epoch.data();
        tile_waits.signals_per_count = static_cast<std::uint32_t>(m.ctas_per_peer);
      }
      m.ffn->run_gemm0(stream, m.local_row_offset.data(), rows, bound, tile_waits, m.gemm0_tile_times.data());
      mark(kEpActivation);
      m.ffn->run_activation(stream, bound);
      mark(kEpGemm1);
      if (overlap) {  // the consumer starts with GEMM1, on its own stream
        // last step's consumer was joined before its combine, so nobody reads these now
        TILEMOE_CUDA_CHECK(cudaMemsetAsync(m.band_flags.data(), 0, m.band_flags.count() * sizeof(unsigned), stream));
        TILEMOE_CUDA_CHECK(cudaEventRecord(m.fork, stream));
        TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(m.consumer, m.fork, 0));
        BandConsumerArgs ts;
        ts.exchange = args;
        ts.plan = m.device_plan->view();
        ts.first_segment = dispatch_segments;  // the pieces follow the dispatch (tile_signal_plan.hpp)
        ts.segments_per_unit = m.schedule.bands_per_segment * m.world;
        ts.flags = m.band_flags.data();
        ts.flag_offset = static_cast<int>(m.band_flag());
        ts.ctas = m.schedule.consumer_ctas;
        ts.unit_times = m.unit_times.data();
        launch_band_consumer(m.consumer, view, ts);
        TILEMOE_CUDA_CHECK(cudaEventRecord(m.join, m.consumer));
      }
      if (m.is_comet()) {  // the splits' sends beside GEMM1, each as soon as GEMM1 has finished its split
        // last step's sends were joined before its combine, so nobody reads these now
        TILEMOE_CUDA_CHECK(cudaMemsetAsync(m.split_flags.data(), 0, m.split_flags.count() * sizeof(unsigned), stream));
        TILEMOE_CUDA_CHECK(cudaEventRecord(m.fork, stream));
        TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(m.consumer, m.fork, 0));
        // (the combine after GEMM1 waits for each split's arrival itself)
        SegmentCopyArgs sends = m.segment_args(SegmentDrain::None, dispatch_segments, m.combine_segments(), input, T);
        sends.own_flags = m.split_flags.data();
        sends.own_flag_begin = m.split_flag();
        sends.own_flag_count = static_cast<std::uint32_t>(m.split_flags.count());
        sends.packed_ctas = m.comet.send_ctas;
        launch_segment_copy(m.consumer, view, sends);
        TILEMOE_CUDA_CHECK(cudaEventRecord(m.join, m.consumer));
      }
      unsigned* gemm1_flags = overlap ? m.band_flags.data() : m.is_comet() ? m.split_flags.data() : nullptr;
      const std::uint32_t gemm1_flag = m.is_comet() ? m.split_flag() : m.band_flag();
      m.ffn->run_gemm1(stream, m.local_row_offset.data(), bound, m.ffn_out(), gemm1_flags, static_cast<int>(gemm1_flag),
                       m.gemm1_tile_times.data());
    } else {
      for (int stage : {kEpGemm0, kEpActivation, kEpGemm1}) mark(stage);
    }
    mark(kEpCombineSend);
    if (overlap) {  // the consumers ship the rows; each token is combined once its rows are in
      mark(kEpCombine);
      ArrivalCombineArgs combine;
      combine.epoch = m.epoch.data();
      combine.returned_rows = m.layout.returned_rows;
      combine.row_arrivals = m.layout.row_arrivals;
      combine.expert = m.expert.data();
      combine.weight = m.combine_weight();
      combine.row_of_slot = m.row_of_slot.data();
      combine.tokens = T;
      combine.top_k = k;
      combine.hidden = H;
      combine.local_experts = m.local_experts;
      combine.ctas = m.combine_ctas;
      combine.output = output;
      launch_arrival_combine(stream, view, combine);
      // the step ends with its consumer: the next step's GEMM1 resets the flags it reads
      TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, m.join, 0));
    } else if (m.is_comet()) {  // the splits' sends run beside GEMM1; the plan's combine waits for each split
      // after this rank's sends have ended: a combine grid waiting for arrivals could otherwise
      // fill the SMs before the sends (queued behind a long dispatch) start, and this rank's own
      // rows, which it waits for too, would never be sent. The next step's GEMM1 then also resets
      // flags nobody reads.
      TILEMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, m.join, 0));
      mark(kEpCombine);
      PlanCombineArgs combine;
      combine.layout = m.layout;
      combine.epoch = m.epoch.data();
      combine.plan = m.device_plan->view();
      combine.signals_per_count = m.ctas_per_peer;
      combine.weight = m.combine_weight();
      combine.row_of_slot = m.row_of_slot.data();
      combine.tokens = T;
      combine.top_k = k;
      combine.hidden = H;
      combine.ctas = m.combine_ctas;
      combine.output = output;
      launch_plan_combine(stream, view, combine);
    } else {
      if (m.direct) {
        // the FFN's output rows are the returned rows
      } else if (m.exchange_walks_plan) {  // sequential's combine segments follow its dispatch's
        launch_segment_copy(stream, view, m.segment_args(SegmentDrain::CombineTasks, dispatch_segments, m.combine_segments(), input, T));
      } else {
        m.host_combine_send(stream);
      }
      mark(kEpCombine);
      const auto* returned = m.direct ? m.ffn_out() : reinterpret_cast<const __nv_bfloat16*>(m.region(m.layout.returned_rows));
      launch_combine(stream, returned, m.combine_weight(), m.row_of_slot.data(), T, k, H, output);
    }
    if (m.shared) m.shared->add(stream, input, output, T);  // on the routed sum (shared_expert.hpp)
    mark(kEpStageCount);
  } catch (...) {
    m.failed = true;
    throw;
  }
}

void EpMoeLayer::check(cudaStream_t stream) {
  Impl& m = *impl_;
  use_device(m.device);
  try {
    m.wait_for_step(stream);
    m.transport->throw_if_failed();
  } catch (...) {
    m.failed = true;
    throw;
  }
  int bad = INT_MAX;
  TILEMOE_CUDA_CHECK(cudaMemcpyAsync(&bad, m.error_token.data(), sizeof bad, cudaMemcpyDeviceToHost, m.own));
  m.wait_for_own("the step's error word");
  if (bad != INT_MAX) {
    throw_bad_input("rank " + std::to_string(m.rank) + ", token " + std::to_string(bad) +
                    ": a router logit is NaN or infinite; the router produced invalid values");
  }
}

// The last step's plan as the device compiled it: its tables and header (not its per-token
// tables), after a bounded wait for the step.
StepPlan EpMoeLayer::Impl::download_plan(cudaStream_t stream) const {
  if (!device_plan) {
    throw_bad_input("this layer builds no device plan: it runs the planned GEMM, or sets EpMoeLayerHarness::build_device_plan");
  }
  use_device(device);
  wait_for_step(stream);
  const bool overlap = options.strategy == Strategy::TileSignal;
  const plan_detail::SequentialShape shape = is_comet() ? comet_plan_shape(device_plan_tokens).gemm
                                             : overlap  ? tile_signal_plan_shape(device_plan_tokens).gemm
                                                        : device_plan_shape(device_plan_tokens);
  StepPlan plan;
  plan.strategy = is_comet() ? Strategy::Comet : overlap ? Strategy::TileSignal : Strategy::Sequential;
  plan.rank = rank;
  plan.world_size = world;
  plan.tokens = shape.tokens;
  plan.hidden = config.hidden;
  plan.ffn_hidden = config.ffn_hidden;
  plan.top_k = config.top_k;
  plan.activation = config.activation;
  plan.dtype = config.dtype;
  plan.tile_m = shape.tile_m;
  plan.tile_n0 = shape.tile_n[0];
  plan.tile_n1 = shape.tile_n[1];
  device_plan->download(own, [&](const char* what) { wait_for_own(what); }, plan);
  return plan;
}

StepPlan EpMoeLayerInspector::last_device_plan(const EpMoeLayer& layer, cudaStream_t stream) {
  return layer.impl_->download_plan(stream);
}
TileSignalGpuSchedule EpMoeLayerInspector::tile_signal_schedule(const EpMoeLayer& layer) { return layer.impl_->schedule; }

const int* EpMoeLayerInspector::row_offset(const EpMoeLayer& layer) { return layer.impl_->row_offset.data(); }
const __nv_bfloat16* EpMoeLayerInspector::expert_rows(const EpMoeLayer& layer) {
  return reinterpret_cast<const __nv_bfloat16*>(layer.impl_->region(layer.impl_->layout.dispatch_rows));
}
const __nv_bfloat16* EpMoeLayerInspector::expert_weights0(const EpMoeLayer& layer) {
  if (!layer.impl_->ffn) throw_bad_input("an exchange-only layer (identity experts) has no expert weights");
  return layer.impl_->ffn->weights0();
}
const __nv_bfloat16* EpMoeLayerInspector::expert_weights2(const EpMoeLayer& layer) {
  if (!layer.impl_->ffn) throw_bad_input("an exchange-only layer (identity experts) has no expert weights");
  return layer.impl_->ffn->weights2();
}
std::string EpMoeLayerInspector::gemm_description(const EpMoeLayer& layer) {
  return layer.impl_->ffn ? layer.impl_->ffn->description() : std::string("identity experts");
}

std::vector<DeviceSpan> EpMoeLayer::last_trace(cudaStream_t stream) const {
  const Impl& m = *impl_;
  if (!m.options.record_trace) throw_bad_input("last_trace needs EpMoeLayerOptions::record_trace");
  const StepPlan plan = m.download_plan(stream);
  const int N = m.world, L = m.local_experts;
  const bool overlap = m.options.strategy == Strategy::TileSignal;
  const int first_piece = plan_detail::tile_signal_first_piece(N, L, m.volume);
  const std::size_t per = static_cast<std::size_t>(m.schedule.bands_per_segment * N);
  const std::size_t pieces = overlap ? plan.segments.size() - static_cast<std::size_t>(first_piece) : 0;
  const std::size_t units = (pieces + per - 1) / std::max<std::size_t>(per, 1);
  const auto gemm0 = static_cast<std::size_t>(
      std::count_if(plan.tiles.begin(), plan.tiles.end(), [](const GemmTile& t) { return t.layer == 0; }));
  std::vector<unsigned long long> tiles0(2 * gemm0), tiles1(2 * (plan.tiles.size() - gemm0)), times(3 * units);
  const auto download = [&](std::vector<unsigned long long>& to, const DeviceArray<unsigned long long>& from) {
    if (!to.empty()) TILEMOE_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), to.size() * sizeof(to[0]), cudaMemcpyDeviceToHost, m.own));
  };
  download(tiles0, m.gemm0_tile_times);
  download(tiles1, m.gemm1_tile_times);
  download(times, m.unit_times);
  m.wait_for_own("the last step's times");
  // whether expert rows [lo, hi) hold rows of another rank: rows the plan ships back to a peer
  auto remote = [&](std::int64_t lo, std::int64_t hi) {
    for (const Segment& s : plan.segments) {
      if (s.src == BufferId::ExpertOut && s.dest_rank != m.rank && s.rows > 0 && lo < s.src_row + s.rows && s.src_row < hi) return true;
    }
    return false;
  };
  std::vector<DeviceSpan> spans;
  // a GEMM's tiles (its times are indexed within it): comet's GEMM0 tiles start as their rows land
  const auto add_tiles = [&](const char* track, std::size_t first, const std::vector<unsigned long long>& at, int grid_ctas) {
    const auto clusters = static_cast<std::size_t>(std::max(grid_ctas / 2, 1));
    for (std::size_t k = 0; 2 * k < at.size(); ++k) {
      const GemmTile& t = plan.tiles[first + k];
      if (t.row_end == t.row_begin) continue;
      DeviceSpan s;
      s.rank = m.rank;
      s.track = track;
      s.lane = static_cast<int>(((k / 2) % clusters) * 2 + k % 2);  // cluster c runs items c, c + C, ...
      s.label = "expert " + std::to_string(m.rank * L + t.expert) + " rows " + std::to_string(t.row_begin) + "+" +
                std::to_string(t.row_end - t.row_begin) + " cols " + std::to_string(t.col_begin);
      s.start_ns = at[2 * k];
      s.end_ns = at[2 * k + 1];
      s.remote = remote(t.row_begin, t.row_end);
      spans.push_back(std::move(s));
    }
  };
  add_tiles("GEMM0 tiles", 0, tiles0, m.ffn->gemm0_grid_ctas());
  add_tiles("GEMM1 tiles", gemm0, tiles1, m.ffn->gemm1_grid_ctas());
  for (std::size_t u = 0; u < units; ++u) {
    DeviceSpan s;
    s.rank = m.rank;
    s.track = "consumer";
    s.lane = static_cast<int>(u % static_cast<std::size_t>(m.schedule.consumer_ctas));
    std::int64_t rows = 0;
    for (std::size_t j = u * per; j < std::min(pieces, (u + 1) * per); ++j) {
      const Segment& piece = plan.segments[static_cast<std::size_t>(first_piece) + j];
      rows += piece.rows;
      s.remote = s.remote || (piece.rows > 0 && piece.dest_rank != m.rank);
    }
    s.label = "segment " + std::to_string(u) + ": " + std::to_string(rows) + " rows";
    s.start_ns = times[3 * u + 1];  // from its flags' readiness to its rows shipped
    s.end_ns = times[3 * u + 2];
    spans.push_back(std::move(s));
  }
  return spans;
}

void EpMoeLayer::set_router_gate(std::span<const float> gate, DType logits_dtype) {
  Impl& m = *impl_;
  use_device(m.device);
  m.set_router_gate(m.config, gate, logits_dtype, m.own, [&m](const char* what) { m.wait_for_own(what); });
}

void EpMoeLayer::set_selection_bias(std::span<const float> bias) {
  Impl& m = *impl_;
  use_device(m.device);
  m.set_selection_bias(m.config, bias, m.own, [&m](const char* what) { m.wait_for_own(what); });
}

Routing EpMoeLayer::last_routing(cudaStream_t stream, std::int64_t tokens) const {
  const Impl& m = *impl_;
  m.wait_for_step(stream);
  Routing r;
  r.tokens = tokens;
  r.top_k = m.config.top_k;
  r.expert.resize(static_cast<std::size_t>(tokens * r.top_k));
  r.weight.resize(r.expert.size());
  r.kept.assign(r.expert.size(), 1);
  if (!r.expert.empty()) {
    std::vector<int> row_of_slot(r.expert.size());
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(r.expert.data(), m.expert.data(), r.expert.size() * 4, cudaMemcpyDeviceToHost, m.own));
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(r.weight.data(), m.weight.data(), r.weight.size() * 4, cudaMemcpyDeviceToHost, m.own));
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(row_of_slot.data(), m.row_of_slot.data(), row_of_slot.size() * 4, cudaMemcpyDeviceToHost, m.own));
    m.wait_for_own("the last step's tables");
    for (std::size_t s = 0; s < row_of_slot.size(); ++s) r.kept[s] = row_of_slot[s] >= 0 ? 1 : 0;  // the capacity rule's
  }
  return r;
}

}  // namespace tilemoe::cuda
