#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "combine_vector.cuh"
#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/error.hpp"
#include "moe_kernels.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 32;  // E <= 1024

__device__ inline bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// Lane `lane`'s logits of a token (experts lane, lane + 32, ...; -inf past the experts); true on
// every lane when any of the token's logits is NaN or infinite.
template <int kPerLane>
__device__ inline bool load_token_logits(const float* row, int experts, int lane, float (&value)[kPerLane]) {
  bool bad = false;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    value[i] = e < experts ? row[e] : -INFINITY;
    bad |= e < experts && !isfinite(value[i]);
  }
  return __any_sync(0xffffffffu, bad);
}

// The softmax's numerators in place, exp(logit - max) for the lane's experts, and their sum over
// the warp (each lane's in expert order, then a butterfly): one order for both router kernels.
template <int kPerLane>
__device__ inline float softmax_numerators(int experts, int lane, float (&value)[kPerLane]) {
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + i * kWarp < experts) max_logit = fmaxf(max_logit, value[i]);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, offset));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + i * kWarp < experts) {
      value[i] = expf(value[i] - max_logit);
      sum += value[i];
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

// One warp per token; lane l holds experts l, l + 32, ... (kPerLane of them, E <= 32 * kPerLane).
// kPerLane is a template argument so that every loop unrolls and the values stay in registers
// (with a runtime bound and a dynamic index the array lived in local memory, and the router took
// 0.07-0.17 ms at 16384 tokens for 0.5-16 MB of logits). The order of every sum and comparison
// is the same for any kPerLane, so the result does not depend on it.
template <int kPerLane>
__global__ void router_kernel(const float* __restrict__ logits, int tokens, int experts, int top_k, bool renormalize,
                              std::int32_t* __restrict__ expert_out, float* __restrict__ weight_out,
                              int* __restrict__ error_token) {
  const int warps_per_block = blockDim.x / kWarp;
  const int token = blockIdx.x * warps_per_block + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (token >= tokens) return;
  float value[kPerLane];
  if (load_token_logits(logits + static_cast<std::size_t>(token) * experts, experts, lane, value)) {
    if (lane == 0) atomicMin(error_token, token);
    return;
  }
  const float sum = softmax_numerators(experts, lane, value);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + i * kWarp >= experts) value[i] = -1.0f;  // never chosen
  }
  float chosen_sum = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    float best = -2.0f;
    int best_id = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarp;
      if (e < experts && better(value[i], e, best, best_id)) best = value[i], best_id = e;
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (better(other, other_id, best, best_id)) best = other, best_id = other_id;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + i * kWarp == best_id) value[i] = -1.0f;  // taken
    }
    const float p = best / sum;
    chosen_sum += p;
    if (lane == 0) {
      expert_out[static_cast<std::size_t>(token) * top_k + j] = best_id;
      weight_out[static_cast<std::size_t>(token) * top_k + j] = p;
    }
  }
  if (renormalize && lane == 0) {
    for (int j = 0; j < top_k; ++j) weight_out[static_cast<std::size_t>(token) * top_k + j] /= chosen_sum;
  }
}

// Any other rule (include/tilemoe/routing.hpp, whose order of operations this follows; the CPU's
// route() is the reference), one warp per token as above. Per warp in shared memory: the group
// scores and which groups are kept (groups of at least 2 experts: at most 512 of them).
constexpr int kMaxGroups = kWarp * kMaxPerLane / 2;
constexpr int kRuleWarpsPerBlock = 4;

// Keeps the two largest of the values seen (a group's score is their sum).
__device__ inline void keep_top_two(float v, float& best, float& second) {
  if (v > best) {
    second = best;
    best = v;
  } else if (v > second) {
    second = v;
  }
}

template <int kPerLane>
__global__ void rule_router_kernel(const float* __restrict__ logits, int tokens, int experts, int top_k, RouterRule rule,
                                   std::int32_t* __restrict__ expert_out, float* __restrict__ weight_out,
                                   int* __restrict__ error_token) {
  __shared__ float s_group_score[kRuleWarpsPerBlock][kMaxGroups];
  __shared__ unsigned char s_kept[kRuleWarpsPerBlock][kMaxGroups];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int token = blockIdx.x * kRuleWarpsPerBlock + warp;
  if (token >= tokens) return;  // the whole warp: nothing below synchronises more than the warp
  const RouterConfig& r = rule.config;
  float score[kPerLane], choice[kPerLane];
  if (load_token_logits(logits + static_cast<std::size_t>(token) * experts, experts, lane, score)) {
    if (lane == 0) atomicMin(error_token, token);
    return;
  }
  // 1. scores in fp32 (past the experts: never read, their choice is -inf below)
  if (r.score == ScoreFunction::Softmax) {
    const float sum = softmax_numerators(experts, lane, score);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] /= sum;
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float x = score[i];
      if (r.score == ScoreFunction::Sigmoid) score[i] = 1.0f / (1.0f + expf(-x));
      if (r.score == ScoreFunction::SqrtSoftplus) score[i] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));  // torch's threshold
    }
  }
  // 2. the choice scores: biased, and -inf outside the kept groups (never chosen)
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    choice[i] = e >= experts ? -INFINITY : rule.selection_bias != nullptr ? score[i] + rule.selection_bias[e] : score[i];
  }
  if (r.groups > 1) {
    const int groups = static_cast<int>(r.groups), size = experts / groups;
    for (int g = 0; g < groups; ++g) {
      float best = -INFINITY, second = -INFINITY;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + i * kWarp;
        if (e < experts && e / size == g) keep_top_two(choice[i], best, second);
      }
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {  // every lane ends with the group's two best
        const float other_best = __shfl_xor_sync(0xffffffffu, best, offset);
        const float other_second = __shfl_xor_sync(0xffffffffu, second, offset);
        keep_top_two(other_best, best, second);
        keep_top_two(other_second, best, second);
      }
      if (lane == 0) s_group_score[warp][g] = best + second;
    }
    __syncwarp();
    for (int g = lane; g < groups; g += kWarp) {  // kept: fewer than top_groups groups are better (ties: lower id)
      const float mine = s_group_score[warp][g];
      int better_groups = 0;
      for (int h = 0; h < groups; ++h) better_groups += better(s_group_score[warp][h], h, mine, g) ? 1 : 0;
      s_kept[warp][g] = better_groups < r.top_groups ? 1 : 0;
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarp;
      if (e < experts && s_kept[warp][e / size] == 0) choice[i] = -INFINITY;
    }
  }
  // 3. the k best choices in slot order, each weighed by its unbiased score
  unsigned taken = 0;  // bit i: expert lane + 32 i is chosen
  float* weight = weight_out + static_cast<std::size_t>(token) * top_k;
  for (int j = 0; j < top_k; ++j) {
    float best = -INFINITY, best_score = 0.0f;
    int best_id = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarp;
      if (e < experts && ((taken >> i) & 1u) == 0 && better(choice[i], e, best, best_id)) {
        best = choice[i];
        best_id = e;
        best_score = score[i];
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      const float other_score = __shfl_xor_sync(0xffffffffu, best_score, offset);
      if (better(other, other_id, best, best_id)) best = other, best_id = other_id, best_score = other_score;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + i * kWarp == best_id) taken |= 1u << i;
    }
    if (lane == 0) {
      expert_out[static_cast<std::size_t>(token) * top_k + j] = best_id;
      weight[j] = best_score;
    }
  }
  if (lane != 0) return;
  // 4. the weights, in slot order
  if (r.weights == RouterWeights::SoftmaxOfSelected) {
    float top = weight[0], sum = 0.0f;
    for (int j = 1; j < top_k; ++j) top = fmaxf(top, weight[j]);
    for (int j = 0; j < top_k; ++j) {
      weight[j] = expf(weight[j] - top);
      sum += weight[j];
    }
    for (int j = 0; j < top_k; ++j) weight[j] /= sum;
  }
  if (rule.renormalize) {
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) sum += weight[j];
    const float denominator = sum + r.renormalize_epsilon;
    for (int j = 0; j < top_k; ++j) weight[j] /= denominator;
  }
  for (int j = 0; j < top_k; ++j) weight[j] *= r.scaling;
}

// row_offset[e] = the first row whose expert is >= e, over the sorted experts of the rows.
__global__ void offsets_kernel(const std::int32_t* __restrict__ sorted_expert, int slots, int experts,
                               int* __restrict__ row_offset) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= slots) return;
  const int e = sorted_expert[i];
  const int previous = i > 0 ? sorted_expert[i - 1] : -1;
  for (int x = previous + 1; x <= e; ++x) row_offset[x] = i;
  if (i == slots - 1) {
    for (int x = e + 1; x <= experts; ++x) row_offset[x] = slots;
  }
}

__global__ void empty_offsets_kernel(int experts, int* row_offset) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e <= experts) row_offset[e] = 0;
}

__global__ void inverse_kernel(const int* __restrict__ slot_of_row, const std::int32_t* __restrict__ sorted_key, int slots,
                               int experts, int* __restrict__ row_of_slot) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < slots) row_of_slot[slot_of_row[i]] = sorted_key[i] < experts ? i : -1;
}

// The capacity rule's order: a slot's priority key sorts by expert, then by its place among the
// token's choices; a stable sort keeps tokens ascending inside.
__global__ void priority_key_kernel(const std::int32_t* __restrict__ expert, int slots, int top_k, std::int32_t* __restrict__ key) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < slots) key[s] = expert[s] * top_k + s % top_k;
}

// first[e] = the first position of expert e in the priority order (e = experts: the end).
__global__ void priority_starts_kernel(const std::int32_t* __restrict__ sorted_priority, int slots, int top_k, int experts,
                                       int* __restrict__ first) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= slots) return;
  const int e = sorted_priority[i] / top_k;
  const int previous = i > 0 ? sorted_priority[i - 1] / top_k : -1;
  for (int x = previous + 1; x <= e; ++x) first[x] = i;
  if (i == slots - 1) {
    for (int x = e + 1; x <= experts; ++x) first[x] = slots;
  }
}

// A slot keeps its expert as its layout key while its expert has capacity; a dropped slot's key
// is `experts`, past every expert.
__global__ void capacity_key_kernel(const std::int32_t* __restrict__ sorted_priority, const int* __restrict__ ordered_slots,
                                    const int* __restrict__ first, int slots, int top_k, int experts, int capacity,
                                    std::int32_t* __restrict__ key) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= slots) return;
  const int e = sorted_priority[i] / top_k;
  key[ordered_slots[i]] = i - first[e] < capacity ? e : experts;
}

__device__ inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void random_bf16_kernel(__nv_bfloat16* p, std::size_t n, std::uint64_t seed, float scale, std::uint64_t first_index) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float unit = static_cast<float>(mix(seed * 0x632be59bd9b4e019ull + first_index + i) >> 40) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn((2.0f * unit - 1.0f) * scale);
  }
}

__global__ void fill_kernel(int* p, int n, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

__global__ void iota_kernel(int n, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

__global__ void permute_kernel(const uint4* __restrict__ x, int vectors_per_row, int top_k, const int* __restrict__ slot_of_row,
                               int rows, uint4* __restrict__ out) {
  const int row = blockIdx.x;
  if (row >= rows) return;
  const int token = slot_of_row[row] / top_k;
  const uint4* src = x + static_cast<std::size_t>(token) * vectors_per_row;
  uint4* dst = out + static_cast<std::size_t>(row) * vectors_per_row;
  for (int v = threadIdx.x; v < vectors_per_row; v += blockDim.x) dst[v] = src[v];
}

__device__ inline float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

// Eight outputs per thread: 16-byte loads and stores (ffn % 8 == 0).
__global__ void activation_kernel(const __nv_bfloat16* __restrict__ h, long long rows, int ffn, bool use_gelu,
                                  __nv_bfloat16* __restrict__ act) {
  const long long groups = rows * ffn / 8;
  for (long long g = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<long long>(gridDim.x) * blockDim.x) {
    float out[8];
    if (use_gelu) {
      const uint4 v = reinterpret_cast<const uint4*>(h)[g];
      const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
      for (int q = 0; q < 4; ++q) {
        out[2 * q] = gelu(__bfloat162float(p[q].x));
        out[2 * q + 1] = gelu(__bfloat162float(p[q].y));
      }
    } else {
      // outputs 8g .. 8g+7 read the gate/up pairs 16g .. 16g+15 of the same row (ffn % 8 == 0)
      const uint4* src = reinterpret_cast<const uint4*>(h) + 2 * g;
      const uint4 v[2] = {src[0], src[1]};
      const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(v);
      for (int q = 0; q < 8; ++q) out[q] = silu(__bfloat162float(p[q].x)) * __bfloat162float(p[q].y);
    }
    uint4 packed;
    __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&packed);
    for (int q = 0; q < 4; ++q) r[q] = __floats2bfloat162_rn(out[2 * q], out[2 * q + 1]);
    reinterpret_cast<uint4*>(act)[g] = packed;
  }
}

__global__ void combine_kernel(const __nv_bfloat16* __restrict__ y, const float* __restrict__ weight,
                               const int* __restrict__ row_of_slot, int tokens, int top_k, int hidden,
                               __nv_bfloat16* __restrict__ out) {
  const int token = blockIdx.x;
  if (token >= tokens) return;
  const int vectors = hidden / 8;
  for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
    reinterpret_cast<uint4*>(out + static_cast<std::size_t>(token) * hidden)[v] =
        combine_vector(y, weight, row_of_slot, token, top_k, hidden, v);
  }
}

// the slot ids to sort, rounded up so that CUB's storage after them stays 256-byte aligned
std::size_t slot_ids_bytes(int slots) { return (sizeof(int) * static_cast<std::size_t>(slots) + 255) / 256 * 256; }

int blocks_for(long long n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

int bits_for(int experts) {
  int bits = 1;
  while ((1 << bits) < experts) ++bits;
  return bits;
}

}  // namespace

void launch_random_bf16(cudaStream_t stream, __nv_bfloat16* p, std::size_t n, std::uint64_t seed, float scale,
                        std::uint64_t first_index) {
  if (n == 0) return;
  random_bf16_kernel<<<132 * 8, 256, 0, stream>>>(p, n, seed, scale, first_index);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

namespace {
__global__ void round_to_bf16_kernel(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = __bfloat162float(__float2bfloat16_rn(p[i]));
}
}  // namespace

void launch_round_to_bf16(cudaStream_t stream, float* p, int n) {
  if (n == 0) return;
  round_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(p, n);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_fill(cudaStream_t stream, int* p, int n, int value) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(p, n, value);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_router(cudaStream_t stream, const float* logits, int tokens, int experts, int top_k, const RouterRule& rule,
                   std::int32_t* expert, float* weight, int* error_token) {
  if (experts > kWarp * kMaxPerLane) throw_bad_input("the CUDA router handles at most 1024 experts");
  if (rule.config.groups > 1 && (rule.config.groups > kMaxGroups || experts % rule.config.groups != 0)) {
    throw_internal("CUDA router: groups must divide the experts in groups of 2 or more (validate() checks it)");
  }
  if (tokens == 0) return;
  const bool mixtral = rule.config.is_default() && rule.selection_bias == nullptr;
  constexpr int kWarpsPerBlock = 8;
  // the smallest lane count that holds the experts: every loop unrolls, the values stay in registers
  auto launch = [&]<int kPerLane>() {
    if (mixtral) {
      router_kernel<kPerLane><<<blocks_for(tokens, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, stream>>>(
          logits, tokens, experts, top_k, rule.renormalize, expert, weight, error_token);
    } else {
      rule_router_kernel<kPerLane><<<blocks_for(tokens, kRuleWarpsPerBlock), kRuleWarpsPerBlock * kWarp, 0, stream>>>(
          logits, tokens, experts, top_k, rule, expert, weight, error_token);
    }
  };
  if (experts <= kWarp) {
    launch.template operator()<1>();
  } else if (experts <= 2 * kWarp) {
    launch.template operator()<2>();
  } else if (experts <= 4 * kWarp) {
    launch.template operator()<4>();
  } else if (experts <= 8 * kWarp) {
    launch.template operator()<8>();
  } else if (experts <= 16 * kWarp) {
    launch.template operator()<16>();
  } else {
    launch.template operator()<kMaxPerLane>();
  }
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

// The layout's scratch: the slot ids to sort, then with a capacity the priority keys, their
// sorted copy, the slots in priority order, each expert's first position and the layout keys,
// then CUB's own temporary storage (room for either sort).
std::size_t layout_temp_bytes(int slots, int experts, int top_k) {
  std::size_t bytes = 0, priority_bytes = 0;
  TILEMOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const std::int32_t*>(nullptr),
                                                     static_cast<std::int32_t*>(nullptr), static_cast<const int*>(nullptr),
                                                     static_cast<int*>(nullptr), slots, 0, bits_for(experts + 1)));
  TILEMOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, priority_bytes, static_cast<const std::int32_t*>(nullptr),
                                                     static_cast<std::int32_t*>(nullptr), static_cast<const int*>(nullptr),
                                                     static_cast<int*>(nullptr), slots, 0, bits_for(experts * top_k)));
  return 5 * slot_ids_bytes(slots) + slot_ids_bytes(experts + 1) + std::max(bytes, priority_bytes);
}

void launch_layout(cudaStream_t stream, const std::int32_t* expert, int slots, int top_k, int experts, int capacity, void* temp,
                   std::size_t temp_bytes, std::int32_t* sorted_expert, int* row_offset, int* slot_of_row,
                   int* row_of_slot) {
  if (slots == 0) {
    empty_offsets_kernel<<<blocks_for(experts + 1, 256), 256, 0, stream>>>(experts, row_offset);
    TILEMOE_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // carve the scratch (layout_temp_bytes; CUB refuses its part if the caller's is too small)
  char* at = static_cast<char*>(temp);
  auto carve = [&](std::size_t bytes) {
    void* p = at;
    at += bytes;
    return p;
  };
  auto* slot_ids = static_cast<int*>(carve(slot_ids_bytes(slots)));
  auto* priority = static_cast<std::int32_t*>(carve(slot_ids_bytes(slots)));
  auto* sorted_priority = static_cast<std::int32_t*>(carve(slot_ids_bytes(slots)));
  auto* ordered_slots = static_cast<int*>(carve(slot_ids_bytes(slots)));
  auto* capacity_key = static_cast<std::int32_t*>(carve(slot_ids_bytes(slots)));
  auto* first = static_cast<int*>(carve(slot_ids_bytes(experts + 1)));
  const auto carved = static_cast<std::size_t>(at - static_cast<char*>(temp));
  if (carved > temp_bytes) throw_internal("layout: scratch too small (layout_temp_bytes)");
  const std::size_t cub_bytes = temp_bytes - carved;
  const int blocks = blocks_for(slots, 256);
  iota_kernel<<<blocks, 256, 0, stream>>>(slots, slot_ids);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
  const std::int32_t* key = expert;
  if (capacity >= 0) {  // the slots in priority order, then each one's key by its place among its expert's
    priority_key_kernel<<<blocks, 256, 0, stream>>>(expert, slots, top_k, priority);
    TILEMOE_CUDA_CHECK(cudaGetLastError());
    std::size_t bytes = cub_bytes;
    TILEMOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(at, bytes, priority, sorted_priority, slot_ids, ordered_slots, slots, 0,
                                                       bits_for(experts * top_k), stream));
    priority_starts_kernel<<<blocks, 256, 0, stream>>>(sorted_priority, slots, top_k, experts, first);
    TILEMOE_CUDA_CHECK(cudaGetLastError());
    capacity_key_kernel<<<blocks, 256, 0, stream>>>(sorted_priority, ordered_slots, first, slots, top_k, experts, capacity,
                                                     capacity_key);
    TILEMOE_CUDA_CHECK(cudaGetLastError());
    key = capacity_key;
  }
  std::size_t bytes = cub_bytes;
  // (a dropped slot's key needs one value more: no extra bit, and no extra pass, when nothing drops)
  TILEMOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(at, bytes, key, sorted_expert, slot_ids, slot_of_row, slots, 0,
                                                     bits_for(capacity >= 0 ? experts + 1 : experts), stream));
  offsets_kernel<<<blocks, 256, 0, stream>>>(sorted_expert, slots, experts, row_offset);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
  inverse_kernel<<<blocks, 256, 0, stream>>>(slot_of_row, sorted_expert, slots, experts, row_of_slot);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_permute(cudaStream_t stream, const __nv_bfloat16* x, int hidden, int top_k, const int* slot_of_row, int rows,
                    __nv_bfloat16* rows_out) {
  if (rows == 0) return;
  permute_kernel<<<rows, 128, 0, stream>>>(reinterpret_cast<const uint4*>(x), hidden / 8, top_k, slot_of_row, rows,
                                          reinterpret_cast<uint4*>(rows_out));
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_activation(cudaStream_t stream, const __nv_bfloat16* h, int rows, int ffn, bool gelu, __nv_bfloat16* act) {
  if (rows == 0) return;
  const long long groups = static_cast<long long>(rows) * ffn / 8;
  activation_kernel<<<std::min(blocks_for(groups, 256), 132 * 16), 256, 0, stream>>>(h, rows, ffn, gelu, act);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_combine(cudaStream_t stream, const __nv_bfloat16* y, const float* weight, const int* row_of_slot, int tokens,
                    int top_k, int hidden, __nv_bfloat16* out) {
  if (tokens == 0) return;
  combine_kernel<<<tokens, 128, 0, stream>>>(y, weight, row_of_slot, tokens, top_k, hidden, out);
  TILEMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tilemoe::cuda
