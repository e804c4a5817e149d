// Standalone GPU test of tilemoe::cuda::PlannedGemm, the tile-table grouped GEMM with fused
// activation and per-tile ready flags (needs an sm_90 GPU; exits 77 without one).
//  - every (cluster, epilogue) on random bf16 problems with unequal groups (0 rows, 1 row, odd
//    rows, a partial N tile, K not a multiple of 64) against an fp32 GPU reference with the
//    activation applied in double on the host; D is poisoned before each run, rows outside the
//    groups must stay poisoned, two runs must agree bit for bit;
//  - the Store epilogue bitwise equal to the stock CUTLASS grouped GEMM of the same tile;
//  - the device-built table equal to the host-built one; a table with its cluster items shuffled
//    and one with row bands that do not start at multiples of 128 give the same bits;
//  - flags: per tile and per band, counts after two runs; a consumer kernel on other SMs that
//    waits for each tile's flag (bounded) and copies the tile must see the final data;
//  - tile timestamps, sm_limit, empty and overflowing tables, and the host-side checks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "comm/cuda/bounded_sync.hpp"
#include "kernels/gemm/stock/grouped_gemm.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "kernels/gemm/planned/planned_gemm_probe.hpp"
#include "tilemoe/error.hpp"
#include "gpu_checks.hpp"
#include "sm90_device.hpp"

using namespace tilemoe::cuda;

#define CK(call)                                                                                          \
  do {                                                                                                    \
    const cudaError_t err_ = (call);                                                                      \
    if (err_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

namespace {

using tilemoe::gpu_checks::expect;

template <class F>
void expect_throws(const std::string& what, F&& f) {
  try {
    f();
    expect(false, what + ": no error");
  } catch (const tilemoe::Error& e) {
    expect(e.kind() == tilemoe::ErrorKind::BadInput, what + ": wrong error kind: " + e.what());
  }
}

// Every wait on the GPU is bounded: a launch that does not finish within the limit is a
// stall, named, and the test ends at once (a stalled kernel cannot be torn down cleanly).
void sync_or_exit(cudaStream_t stream, const char* what) {
  constexpr auto kLimit = std::chrono::seconds(60);
  if (!tilemoe::cuda::wait_for_stream(stream, kLimit)) {
    std::printf("STALL: %s did not finish in %lld s\n", what, static_cast<long long>(kLimit.count()));
    std::fflush(stdout);
    std::_Exit(3);
  }
  CK(cudaGetLastError());
}

constexpr std::uint16_t kPoison = 0xFFFF;

__global__ void fill_uniform(__nv_bfloat16* p, std::size_t n, std::uint32_t seed, float scale) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = std::uint32_t(i) * 0x9E3779B9u ^ seed;
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    p[i] = __float2bfloat16_rn((float(x >> 8) * (2.0f / 16777216.0f) - 1.0f) * scale);
  }
}

// R[r][n] = sum_k A[r][k] * B_g[n][k] in fp32, one thread per output, for the rows of group g.
__global__ void reference_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, const int* row_offset, int groups,
                               int N, int K, float* R) {
  const int r = blockIdx.y;
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  int g = 0;
  while (g < groups && row_offset[g + 1] <= r) ++g;
  if (g == groups) return;
  const __nv_bfloat16* a = A + std::size_t(r) * K;
  const __nv_bfloat16* b = B + (std::size_t(g) * N + n) * K;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = fmaf(__bfloat162float(a[k]), __bfloat162float(b[k]), acc);
  R[std::size_t(r) * N + n] = acc;
}

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ unsigned acquire_load(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Waits (bounded) for each flagged entry's flag, then copies the entry's output tile.
__global__ void tile_consumer(const GemmTileEntry* table, int entries, const unsigned* flags, unsigned expected,
                              const __nv_bfloat16* D, __nv_bfloat16* copy, int n_out, int tile_cols,
                              unsigned long long timeout_ns, int* timed_out, unsigned long long* copy_time) {
  const unsigned long long deadline = now_ns() + timeout_ns;
  __shared__ int give_up;
  for (int i = blockIdx.x; i < entries; i += gridDim.x) {
    const GemmTileEntry e = table[i];
    if (e.flag < 0) continue;
    if (threadIdx.x == 0) {
      give_up = 0;
      while (acquire_load(flags + e.flag) < expected) {
        if (now_ns() > deadline) {
          atomicExch(timed_out, i + 1);
          give_up = 1;
          break;
        }
      }
    }
    __syncthreads();
    if (give_up) return;
    const int chunks = tile_cols / 8;
    for (int c = threadIdx.x; c < e.rows * chunks; c += blockDim.x) {
      const std::size_t row = std::size_t(e.row_begin) + c / chunks;
      const std::size_t col = std::size_t(e.col_tile) * tile_cols + (c % chunks) * 8;
      if (col >= std::size_t(n_out)) continue;
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(D + row * n_out + col));
      *reinterpret_cast<uint4*>(copy + row * n_out + col) = v;
    }
    if (threadIdx.x == 0) copy_time[i] = now_ns();
    __syncthreads();
  }
}

float bf16f(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

const char* epilogue_name(PlannedEpilogue e) {
  return e == PlannedEpilogue::Store ? "store" : e == PlannedEpilogue::SwiGLU ? "swiglu" : "gelu";
}

template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) { CK(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T))); }
  Dev(const std::vector<T>& host) : Dev(host.size()) {
    if (n) CK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// One problem: groups of rows (with `gap` unused rows after the last group), weights, reference.
struct Problem {
  std::vector<int> rows, offset;
  int a_rows = 0, N = 0, K = 0, n_out = 0;
  PlannedEpilogue epilogue;
  Dev<__nv_bfloat16> A, B;
  Dev<int> d_offset;
  std::vector<double> ref;  // [a_rows][n_out]; rows outside every group are NaN (must stay poisoned)

  static std::vector<int> offsets(const std::vector<int>& m) {
    std::vector<int> o(m.size() + 1, 0);
    for (std::size_t g = 0; g < m.size(); ++g) o[g + 1] = o[g] + m[g];
    return o;
  }
  Problem(std::vector<int> m, int gap, int N_, int K_, PlannedEpilogue ep, std::uint32_t seed)
      : rows(m), offset(offsets(m)), a_rows(offset.back() + gap), N(N_), K(K_),
        n_out(ep == PlannedEpilogue::SwiGLU ? N_ / 2 : N_), epilogue(ep), A(std::size_t(a_rows) * K),
        B(m.size() * std::size_t(N) * K), d_offset(offset) {
    fill_uniform<<<512, 256>>>(A.p, A.n, seed * 7 + 1, 1.0f);
    fill_uniform<<<512, 256>>>(B.p, B.n, seed * 7 + 2, 1.0f / std::sqrt(float(K)) * 1.7f);
    CK(cudaGetLastError());
    Dev<float> R(std::size_t(a_rows) * N);
    CK(cudaMemset(R.p, 0, R.n * sizeof(float)));
    if (a_rows > 0) {
      reference_gemm<<<dim3((N + 127) / 128, a_rows), 128>>>(A.p, B.p, d_offset.p, int(m.size()), N, K, R.p);
      CK(cudaGetLastError());
    }
    const std::vector<float> r = R.get();
    ref.assign(std::size_t(a_rows) * n_out, std::nan(""));
    for (int row = 0; row < offset.back(); ++row) {
      for (int c = 0; c < n_out; ++c) {
        const float* x = &r[std::size_t(row) * N];
        double v;
        if (ep == PlannedEpilogue::SwiGLU) {
          const double g = x[2 * c], u = x[2 * c + 1];
          v = g / (1.0 + std::exp(-g)) * u;
        } else if (ep == PlannedEpilogue::GELU) {
          v = 0.5 * x[c] * (1.0 + std::erf(x[c] / std::sqrt(2.0)));
        } else {
          v = x[c];
        }
        ref[std::size_t(row) * n_out + c] = v;
      }
    }
  }
};

struct Output {
  Dev<__nv_bfloat16> D;
  explicit Output(const Problem& p) : D(std::size_t(p.a_rows) * p.n_out) {}
  void poison(cudaStream_t s) { CK(cudaMemsetAsync(D.p, 0xFF, D.n * 2, s)); }
  std::vector<std::uint16_t> bits() const {
    std::vector<std::uint16_t> h(D.n);
    if (D.n) CK(cudaMemcpy(h.data(), D.p, D.n * 2, cudaMemcpyDeviceToHost));
    return h;
  }
};

// Compares D with the reference: rows outside the groups poisoned, the rest finite and close.
void check_against_reference(const std::string& label, const Problem& p, const std::vector<std::uint16_t>& d) {
  double ss_ref = 0, ss_diff = 0;
  std::size_t bad = 0, untouched_gap = 0, gap = 0, nonfinite = 0;
  for (std::size_t i = 0; i < p.ref.size(); ++i) {
    if (std::isnan(p.ref[i])) {
      ++gap;
      untouched_gap += d[i] == kPoison;
      continue;
    }
    ss_ref += p.ref[i] * p.ref[i];
  }
  const double rms = std::sqrt(ss_ref / std::max<std::size_t>(1, p.ref.size() - gap));
  for (std::size_t i = 0; i < p.ref.size(); ++i) {
    if (std::isnan(p.ref[i])) continue;
    const double v = bf16f(d[i]);
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    const double diff = v - p.ref[i];
    ss_diff += diff * diff;
    if (std::fabs(diff) > 0.0079 * std::fabs(p.ref[i]) + 0.002 * rms) ++bad;
  }
  const double rel = ss_ref > 0 ? std::sqrt(ss_diff / ss_ref) : 0.0;
  std::printf("  %-44s rel.err %.2e  outside tolerance %zu  non-finite %zu\n", label.c_str(), rel, bad, nonfinite);
  expect(nonfinite == 0, label + ": non-finite outputs (poison not overwritten)");
  expect(bad == 0 && rel < 1e-2, label + ": outputs differ from the reference");
  expect(untouched_gap == gap, label + ": rows outside every group were written");
}

struct Table {
  Dev<GemmTileEntry> d;
  Dev<int> count;
  explicit Table(const std::vector<GemmTileEntry>& t) : d(t), count(std::vector<int>{int(t.size())}) {}
};

PlannedGemmRun make_run(const Problem& p, const Table& t, Output& out, unsigned* flags = nullptr,
                        unsigned long long* times = nullptr) {
  PlannedGemmRun r;
  r.table = t.d.p;
  r.count = t.count.p;
  r.A = p.A.p;
  r.a_rows = p.a_rows;
  r.B = p.B.p;
  r.groups = int(p.rows.size());
  r.D = out.D.p;
  r.N = p.N;
  r.K = p.K;
  r.flags = flags;
  r.tile_times = times;
  return r;
}

// One run into a poisoned output; padding_mma and item_fetch pick the variant (Default: the
// GEMM's own choice); probe, when set, receives the kernel's records.
std::vector<std::uint16_t> run_once(PlannedGemm& gemm, const Problem& p, const Table& t, cudaStream_t s,
                                    unsigned* flags = nullptr, PaddingMma padding_mma = PaddingMma::Default,
                                    ItemFetch item_fetch = ItemFetch::Default, PlannedProbeRecord* probe = nullptr) {
  Output out(p);
  out.poison(s);
  PlannedGemmRun r = make_run(p, t, out, flags);
  r.padding_mma = padding_mma;
  r.item_fetch = item_fetch;
  r.probe = probe;
  gemm.run(s, r);
  const std::string what = std::string("a planned GEMM run (padding MMAs ") + padding_mma_name(padding_mma) + ", " +
                           item_fetch_name(item_fetch) + " fetch)";
  sync_or_exit(s, what.c_str());
  return out.bits();
}

// A run with the probe (planned_gemm_probe.hpp) in mapped host memory: the same bits, every role
// of every CTA done, and the pipeline counts add up: each CTA's loader and both its MMA warp
// groups passed the same K tiles through the stages, and all CTAs together K tiles x entries.
void check_probe(const std::string& label, PlannedGemm& gemm, const Problem& p, const Table& t,
                 const std::vector<std::uint16_t>& bits, cudaStream_t s, ItemFetch fetch) {
  MappedProbe probe(gemm.grid_ctas());
  expect(run_once(gemm, p, t, s, nullptr, PaddingMma::Default, fetch, probe.device()) == bits,
         label + ": a run with the probe changes the bits");
  const std::vector<PlannedProbeRecord> records = probe.snapshot();
  const std::size_t not_done = records.size() - roles_done(records);
  long long mismatched = 0, total = 0;
  for (std::size_t cta = 0; cta < records.size() / kProbeRoles; ++cta) {
    const PlannedProbeRecord* role = records.data() + cta * kProbeRoles;
    mismatched += role[1].count != role[0].count || role[2].count != role[0].count;
    total += role[0].count;
  }
  const long long k_tiles = (p.K + kPlannedTileK - 1) / kPlannedTileK;
  expect(not_done == 0, label + ": " + std::to_string(not_done) + " probe roles not done after the run");
  expect(mismatched == 0, label + ": " + std::to_string(mismatched) + " CTAs whose roles' pipeline counts differ");
  expect(total == k_tiles * static_cast<long long>(t.d.n),
         label + ": the loaders passed " + std::to_string(total) + " K tiles, not " + std::to_string(k_tiles) + " x " +
             std::to_string(t.d.n) + " entries");
}

// Per-tile flags of `table` not at `runs` (flag -1: not at 0) after that many runs.
std::size_t flags_off(const std::vector<GemmTileEntry>& table, const Dev<unsigned>& flags, unsigned runs) {
  const std::vector<unsigned> f = flags.get();
  std::size_t off = 0;
  for (std::size_t i = 0; i < table.size(); ++i) off += f[i] != (table[i].flag >= 0 ? runs : 0u);
  return off;
}

// Cluster items (mate pairs) in a random order: the same tiles, another schedule.
std::vector<GemmTileEntry> shuffled_items(const std::vector<GemmTileEntry>& t, std::uint32_t seed) {
  std::vector<int> items(t.size() / 2);
  for (std::size_t i = 0; i < items.size(); ++i) items[i] = int(i);
  std::mt19937 rng(seed);
  std::shuffle(items.begin(), items.end(), rng);
  std::vector<GemmTileEntry> out;
  for (int i : items) {
    out.push_back(t[2 * i]);
    out.push_back(t[2 * i + 1]);
  }
  return out;
}

// Bands of 96 rows from each group's first row (not multiples of 128), as a plan's row bands.
std::vector<GemmTileEntry> banded_table(const Problem& p, PlannedCluster cluster) {
  const int n_tiles = (p.N + kPlannedTileN - 1) / kPlannedTileN;
  std::vector<GemmTileEntry> t;
  for (int g = 0; g < int(p.rows.size()); ++g) {
    std::vector<std::pair<int, int>> bands;
    for (int r = 0; r < p.rows[g]; r += 96) bands.push_back({p.offset[g] + r, std::min(96, p.rows[g] - r)});
    if (cluster == PlannedCluster::M2) {
      if (bands.size() % 2) bands.push_back({bands.back().first, 0});
      for (int n = 0; n < n_tiles; ++n)
        for (auto& b : bands) t.push_back({g, b.first, b.second, n, -1});
    } else {
      for (auto& b : bands)
        for (int n = 0; n < n_tiles + (n_tiles % 2); ++n) t.push_back({g, b.first, n < n_tiles ? b.second : 0, std::min(n, n_tiles - 1), -1});
    }
  }
  return t;
}

void test_problem(const std::string& name, const std::vector<int>& m, int gap, int N, int K, cudaStream_t s,
                  std::uint32_t seed) {
  for (PlannedEpilogue ep : {PlannedEpilogue::Store, PlannedEpilogue::SwiGLU, PlannedEpilogue::GELU}) {
    Problem p(m, gap, N, K, ep, seed);
    for (PlannedCluster cl : {PlannedCluster::M2, PlannedCluster::N2}) {
      const std::string label = name + " " + planned_cluster_name(cl) + " " + epilogue_name(ep);
      PlannedGemm gemm(cl, ep, int(m.size()), 0);
      const std::vector<GemmTileEntry> host = build_tile_table(p.offset, N, cl, TileFlags::PerTile);
      check_tile_table(host, int(m.size()), p.a_rows, N, cl, int(host.size()));

      // the device builder writes the same table
      const std::size_t cap = std::size_t(max_tile_entries(p.offset.back(), int(m.size()), N, cl));
      expect(host.size() <= cap, label + ": max_tile_entries below the real count");
      Dev<GemmTileEntry> dt(cap);
      Dev<int> dcount(1);
      launch_build_tile_table(s, p.d_offset.p, int(m.size()), N, cl, TileFlags::PerTile, dt.p, int(cap), dcount.p);
      sync_or_exit(s, "the device tile-table builder");
      const int count = dcount.get()[0];
      std::vector<GemmTileEntry> dev = dt.get();
      dev.resize(std::size_t(std::max(count, 0)));
      expect(count == int(host.size()) && std::memcmp(dev.data(), host.data(), host.size() * sizeof(GemmTileEntry)) == 0,
             label + ": device-built table differs from the host-built one");

      Table table(host);
      Dev<unsigned> flags(host.size());
      CK(cudaMemset(flags.p, 0, flags.n * 4));
      const std::vector<std::uint16_t> d1 = run_once(gemm, p, table, s, flags.p);
      const std::vector<std::uint16_t> d2 = run_once(gemm, p, table, s, flags.p);
      check_against_reference(label, p, d1);
      expect(d1 == d2, label + ": two runs differ");
      const std::size_t wrong_flags = flags_off(host, flags, 2);
      expect(wrong_flags == 0, label + ": " + std::to_string(wrong_flags) + " per-tile flags not at 2 after 2 runs");

      // every warp group issuing its MMAs, padding rows or not, only half tiles skipping, or
      // every padding half: the same bits (the skip is a speed choice only)
      for (PaddingMma mode : {PaddingMma::Issue, PaddingMma::SkipHalfTiles, PaddingMma::SkipAll}) {
        expect(run_once(gemm, p, table, s, nullptr, mode) == d1,
               label + ": padding MMAs '" + padding_mma_name(mode) + "' change the bits");
      }
      // the item fetch: static stride or claimed from a counter, on the full grid and on 4
      // clusters (many items each), run twice (the counter rewinds): every tile once, the same
      // bits, every per-tile flag raised once per run
      PlannedGemm narrow(cl, ep, int(m.size()), 0, 8);
      for (PlannedGemm* g : {&gemm, &narrow}) {
        for (ItemFetch fetch : {ItemFetch::Static, ItemFetch::Dynamic}) {
          const std::string what = label + " on " + std::to_string(g->grid_ctas()) + " CTAs, " + item_fetch_name(fetch) +
                                   " fetch";
          Dev<unsigned> fetch_flags(std::max<std::size_t>(host.size(), 1));
          CK(cudaMemset(fetch_flags.p, 0, fetch_flags.n * 4));
          for (int again = 0; again < 2; ++again) {
            expect(run_once(*g, p, table, s, fetch_flags.p, PaddingMma::Default, fetch) == d1,
                   what + ", run " + std::to_string(again + 1) + ": the bits differ");
          }
          const std::size_t off = flags_off(host, fetch_flags, 2);
          expect(off == 0, what + ": " + std::to_string(off) + " per-tile flags not at 2 after 2 runs");
          check_probe(what, *g, p, table, d1, s, fetch);
        }
      }

      Table shuffled(shuffled_items(host, seed));
      expect(run_once(gemm, p, shuffled, s) == d1, label + ": shuffled tile order changes the bits");
      const std::vector<GemmTileEntry> bands = banded_table(p, cl);
      check_tile_table(bands, int(m.size()), p.a_rows, N, cl, 0);
      Table banded(bands);
      expect(run_once(gemm, p, banded, s) == d1, label + ": 96-row bands change the bits");

      // band blocks (tile_signal's GEMM1 order): the same tiles, each band's tiles together
      // within a block, the device builder equal to the host one, the same bits
      for (int block : {2, 4}) {
        const std::vector<GemmTileEntry> blocked = build_tile_table(p.offset, N, cl, TileFlags::PerBand, block);
        const std::vector<GemmTileEntry> plain = build_tile_table(p.offset, N, cl, TileFlags::PerBand);
        int band_count = 0;
        for (const auto& e : plain) band_count = std::max(band_count, e.flag + 1);
        check_tile_table(blocked, int(m.size()), p.a_rows, N, cl, band_count);
        auto key = [](const GemmTileEntry& e) {
          return std::tuple(e.group, e.row_begin, e.rows, e.col_tile, e.flag);
        };
        std::vector<std::tuple<int, int, int, int, int>> a, b;
        for (const auto& e : blocked) a.push_back(key(e));
        for (const auto& e : plain) b.push_back(key(e));
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        expect(a == b, label + ": band blocks of " + std::to_string(block) + " change the set of tiles");
        // inside a group, a band's last tile comes before any tile of a band two blocks on
        bool block_major = true;
        for (std::size_t i = 0; i < blocked.size(); ++i) {
          for (std::size_t j = i + 1; j < blocked.size() && block_major; ++j) {
            const GemmTileEntry &x = blocked[i], &y = blocked[j];
            if (x.group != y.group || x.rows == 0 || y.rows == 0) continue;
            const int bx = (x.row_begin - p.offset[std::size_t(x.group)]) / kPlannedTileM / block;
            const int by = (y.row_begin - p.offset[std::size_t(y.group)]) / kPlannedTileM / block;
            block_major = bx <= by;
          }
        }
        expect(block_major, label + ": band blocks of " + std::to_string(block) + " are not block after block");
        Dev<GemmTileEntry> bt(cap);
        launch_build_tile_table(s, p.d_offset.p, int(m.size()), N, cl, TileFlags::PerBand, bt.p, int(cap), dcount.p, block);
        sync_or_exit(s, "the device tile-table builder (band blocks)");
        std::vector<GemmTileEntry> dev_blocked = bt.get();
        dev_blocked.resize(std::size_t(std::max(dcount.get()[0], 0)));
        expect(dev_blocked.size() == blocked.size() &&
                   std::memcmp(dev_blocked.data(), blocked.data(), blocked.size() * sizeof(GemmTileEntry)) == 0,
               label + ": device-built band blocks differ from the host-built ones");
        Table blocked_table(blocked);
        Dev<unsigned> band_flags(std::size_t(std::max(band_count, 1)));
        CK(cudaMemset(band_flags.p, 0, band_flags.n * 4));
        expect(run_once(gemm, p, blocked_table, s, band_flags.p) == d1, label + ": band blocks change the bits");
      }

      if (ep == PlannedEpilogue::Store && p.offset.back() > 0) {
        // the stock CUTLASS kernel of the same tile and cluster: the same mainloop, the same bits
        GroupedGemm stock(cl == PlannedCluster::M2 ? GemmConfig::Coop128x256Cluster2x1 : GemmConfig::Coop128x256Cluster1x2,
                          int(m.size()), 0);
        Output out(p);
        out.poison(s);
        stock.run(s, int(m.size()), p.d_offset.p, p.A.p, p.B.p, out.D.p, N, K);
        sync_or_exit(s, "the stock CUTLASS grouped GEMM");
        const std::vector<std::uint16_t> ds = out.bits();
        std::size_t differ = 0;
        for (int i = 0; i < p.offset.back() * p.n_out; ++i) differ += ds[std::size_t(i)] != d1[std::size_t(i)];
        expect(differ == 0, label + ": " + std::to_string(differ) + " outputs differ from the stock CUTLASS kernel");
      }
    }
  }
}

// Per-band flags, timestamps, a concurrent flag consumer, sm_limit, empty and overflowing tables.
void test_flags_and_consumer(cudaStream_t s, int sms) {
  const std::vector<int> m = {1000, 0, 517, 2048, 77, 1300, 640, 900};
  const int N = 2 * 2048, K = 1024;
  Problem p(m, 0, N, K, PlannedEpilogue::SwiGLU, 99);
  const int n_tiles = N / kPlannedTileN;
  for (PlannedCluster cl : {PlannedCluster::M2, PlannedCluster::N2}) {
    const std::string label = std::string("flags ") + planned_cluster_name(cl);
    PlannedGemm full(cl, PlannedEpilogue::SwiGLU, int(m.size()), 0);

    // per band: one flag per 128-row band, reaching n_tiles per run
    const std::vector<GemmTileEntry> bt = build_tile_table(p.offset, N, cl, TileFlags::PerBand);
    int bands = 0;
    for (const auto& e : bt) bands = std::max(bands, e.flag + 1);
    Table band_table(bt);
    Dev<unsigned> band_flags{std::size_t(bands)};
    CK(cudaMemset(band_flags.p, 0, band_flags.n * 4));
    const std::vector<std::uint16_t> ref_bits = run_once(full, p, band_table, s, band_flags.p);
    run_once(full, p, band_table, s, band_flags.p);
    std::size_t wrong = 0;
    for (unsigned v : band_flags.get()) wrong += v != 2u * unsigned(n_tiles);
    expect(wrong == 0 && bands > 0, label + ": " + std::to_string(wrong) + " of " + std::to_string(bands) +
                                        " band flags not at 2 x N tiles");

    // consumer on the SMs the GEMM leaves free, launched first, waiting per tile
    const int consumer_blocks = 8;
    PlannedGemm part(cl, PlannedEpilogue::SwiGLU, int(m.size()), 0, sms - 2 * consumer_blocks);
    expect(part.grid_ctas() <= sms - 2 * consumer_blocks, label + ": sm_limit not respected");
    const std::vector<GemmTileEntry> tt = build_tile_table(p.offset, N, cl, TileFlags::PerTile);
    Table tile_table(tt);
    Dev<unsigned> flags(tt.size());
    Dev<unsigned long long> times(2 * tt.size()), copy_time(tt.size());
    Dev<int> timed_out(1);
    CK(cudaMemset(flags.p, 0, flags.n * 4));
    CK(cudaMemset(times.p, 0, times.n * 8));
    CK(cudaMemset(copy_time.p, 0, copy_time.n * 8));
    CK(cudaMemset(timed_out.p, 0, 4));
    Output out(p), copy(p);
    out.poison(s);
    copy.poison(s);
    sync_or_exit(s, "poisoning the outputs");
    cudaStream_t side;
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    tile_consumer<<<consumer_blocks, 256, 0, side>>>(tile_table.d.p, int(tt.size()), flags.p, 1u, out.D.p, copy.D.p,
                                                      p.n_out, kPlannedTileN / 2, 5'000'000'000ull, timed_out.p,
                                                      copy_time.p);
    CK(cudaGetLastError());
    part.run(s, make_run(p, tile_table, out, flags.p, times.p));
    sync_or_exit(s, "the planned GEMM beside the flag consumer");
    sync_or_exit(side, "the flag consumer");
    CK(cudaStreamDestroy(side));
    expect(timed_out.get()[0] == 0, label + ": the consumer timed out waiting for entry " +
                                        std::to_string(timed_out.get()[0] - 1));
    expect(out.bits() == ref_bits, label + ": sm_limit changes the bits");
    expect(copy.bits() == ref_bits, label + ": a tile read after its flag differs from the final output");
    const std::vector<unsigned long long> t = times.get(), ct = copy_time.get();
    unsigned long long gemm_end = 0, gemm_begin = ~0ull;
    std::size_t bad_times = 0, early = 0;
    for (std::size_t i = 0; i < tt.size(); ++i) {
      bad_times += t[2 * i] == 0 || t[2 * i + 1] < t[2 * i];
      gemm_end = std::max(gemm_end, t[2 * i + 1]);
      gemm_begin = std::min(gemm_begin, t[2 * i]);
    }
    for (std::size_t i = 0; i < tt.size(); ++i) early += tt[i].flag >= 0 && ct[i] < gemm_end;
    expect(bad_times == 0, label + ": " + std::to_string(bad_times) + " tiles without start <= end timestamps");
    std::printf("  %-44s %zu tiles, GEMM %.1f us, %zu tiles copied before the GEMM's last tile ended\n",
                label.c_str(), tt.size(), (gemm_end - gemm_begin) * 1e-3, early);
  }

  // an empty table runs nothing; an overflowing device build yields count -1, which runs nothing
  PlannedGemm gemm(PlannedCluster::N2, PlannedEpilogue::Store, int(m.size()), 0);
  Problem q(m, 0, 512, 256, PlannedEpilogue::Store, 5);
  Table empty(std::vector<GemmTileEntry>{});
  const std::vector<std::uint16_t> d = run_once(gemm, q, empty, s);
  expect(std::all_of(d.begin(), d.end(), [](std::uint16_t v) { return v == kPoison; }), "empty table wrote outputs");
  Dev<GemmTileEntry> small(4);
  Table overflow(std::vector<GemmTileEntry>{});
  launch_build_tile_table(s, q.d_offset.p, int(m.size()), 512, PlannedCluster::N2, TileFlags::None, small.p, 4,
                          overflow.count.p);
  sync_or_exit(s, "the device tile-table builder (overflow)");
  expect(overflow.count.get()[0] == -1, "overflowing table build did not report -1");
  const std::vector<std::uint16_t> d2 = run_once(gemm, q, overflow, s);
  expect(std::all_of(d2.begin(), d2.end(), [](std::uint16_t v) { return v == kPoison; }), "count -1 wrote outputs");
}

void test_bad_input(cudaStream_t s) {
  const std::vector<int> off = {0, 300, 300, 700};
  const std::vector<GemmTileEntry> t = build_tile_table(off, 1024, PlannedCluster::M2, TileFlags::PerTile);
  std::vector<GemmTileEntry> bad = t;
  bad[1].col_tile = (bad[1].col_tile + 1) % 4;
  expect_throws("2x1 mates with different col tiles", [&] { check_tile_table(bad, 3, 700, 1024, PlannedCluster::M2, 100); });
  bad = build_tile_table(off, 1024, PlannedCluster::N2, TileFlags::PerTile);
  bad[1].row_begin += 8;
  expect_throws("1x2 mates at different rows", [&] { check_tile_table(bad, 3, 708, 1024, PlannedCluster::N2, 100); });
  bad = t;
  bad[0].flag = 100;
  expect_throws("flag out of range", [&] { check_tile_table(bad, 3, 700, 1024, PlannedCluster::M2, 100); });
  bad = t;
  bad[0].rows = 129;
  expect_throws("rows > 128", [&] { check_tile_table(bad, 3, 700, 1024, PlannedCluster::M2, 100); });
  bad = t;
  bad.pop_back();
  expect_throws("odd entry count", [&] { check_tile_table(bad, 3, 700, 1024, PlannedCluster::M2, 100); });
  expect_throws("rows past A", [&] { check_tile_table(t, 3, 600, 1024, PlannedCluster::M2, 100); });

  PlannedGemm gemm(PlannedCluster::M2, PlannedEpilogue::SwiGLU, 3, 0);
  Problem p({300, 0, 400}, 0, 1024, 256, PlannedEpilogue::SwiGLU, 3);
  Table table(t);
  Output out(p);
  PlannedGemmRun r = make_run(p, table, out);
  PlannedGemmRun x = r;
  x.N = 1000;
  expect_throws("N not a multiple of 8", [&] { gemm.run(s, x); });
  x = r;
  x.N = 1032;
  expect_throws("SwiGLU N not a multiple of 16", [&] { gemm.run(s, x); });
  x = r;
  x.groups = 4;
  expect_throws("more groups than max_groups", [&] { gemm.run(s, x); });
  x = r;
  x.A = reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(r.A) + 2);
  expect_throws("misaligned A", [&] { gemm.run(s, x); });
  x = r;
  x.table = nullptr;
  expect_throws("no table", [&] { gemm.run(s, x); });
  expect_throws("sm_limit below the cluster", [&] { PlannedGemm g(PlannedCluster::N2, PlannedEpilogue::Store, 3, 0, 1); });
}

}  // namespace

int main(int argc, char** argv) {
  // --small: two small problems and the consumer test only, for compute-sanitizer
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  cudaDeviceProp prop{};
  if (!sm90_device_or_skip(prop, "the planned GEMM")) return 77;
  tilemoe::gpu_checks::print_failures_only();  // hundreds of checks: a line for each failure
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  try {
    test_problem("uneven", {300, 0, 1, 513, 128, 129, 7}, 40, 784, 520, s, 1);
    test_problem("tiny", {1, 2, 3}, 5, 16, 8, s, 3);
    if (!small) {
      test_problem("one group", {1000}, 0, 512, 4096, s, 2);
      test_problem("64 groups", std::vector<int>(64, 70), 0, 1536, 512, s, 4);
      test_flags_and_consumer(s, prop.multiProcessorCount);
    }
    test_bad_input(s);
  } catch (const std::exception& e) {
    tilemoe::gpu_checks::fail(std::string("unexpected exception: ") + e.what());
  }
  CK(cudaStreamDestroy(s));
  return tilemoe::gpu_checks::verdict();
}
