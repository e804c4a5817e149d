// Standalone GPU test of tilemoe::cuda::GroupedGemm (needs an sm_90 GPU; exits 77 without one).
// For each configuration: random bf16 problems with unequal M per group (M = 0 groups, odd M,
// 1, 8 and 64 groups, one large case), compared with a naive fp32 CUDA reference rounded to
// bf16; D is poisoned with NaN (0xFF bytes) before every run and must come back finite, the
// guard rows around D must stay poisoned, and two runs must agree bit for bit. Also: zero groups,
// all-zero M, sm_limit (bitwise equal to the full-GPU result), CUDA-graph replay with new
// row offsets, and the host-side argument checks. Returns nonzero on any failure.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm/stock/grouped_gemm.hpp"
#include "tilemoe/error.hpp"
#include "gpu_checks.hpp"
#include "sm90_device.hpp"

using tilemoe::cuda::GemmConfig;
using tilemoe::cuda::GroupedGemm;
using tilemoe::cuda::gemm_config_name;
using tilemoe::cuda::kAllGemmConfigs;

#define CK(call)                                                                            \
  do {                                                                                      \
    const cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
                   cudaGetErrorString(err_));                                               \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

constexpr int kGuardRows = 8;  // poisoned rows before and after D that the GEMM must not touch
constexpr std::uint16_t kPoison = 0xFFFF;

using tilemoe::gpu_checks::expect;

__device__ std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// Uniform in [-1, 1), rounded to bf16.
__global__ void fill_random(__nv_bfloat16* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::uint32_t h = hash32(std::uint32_t(i) ^ hash32(seed + std::uint32_t(i >> 32)));
    p[i] = __float2bfloat16_rn(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// D[M][N] = A[M][K] * B[N][K]^T, fp32 dot products in k order, rounded once to bf16.
constexpr int kRefTile = 16;
__global__ void reference_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D,
                               int M, int N, int K) {
  __shared__ float As[kRefTile][kRefTile + 1];
  __shared__ float Bs[kRefTile][kRefTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kRefTile + ty;
  const int col = blockIdx.x * kRefTile + tx;
  const int b_row = blockIdx.x * kRefTile + ty;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kRefTile) {
    const int k = k0 + tx;
    As[ty][tx] = (row < M && k < K) ? __bfloat162float(A[std::size_t(row) * K + k]) : 0.0f;
    Bs[ty][tx] = (b_row < N && k < K) ? __bfloat162float(B[std::size_t(b_row) * K + k]) : 0.0f;
    __syncthreads();
    for (int kk = 0; kk < kRefTile; ++kk) acc = fmaf(As[ty][kk], Bs[tx][kk], acc);
    __syncthreads();
  }
  if (row < M && col < N) D[std::size_t(row) * N + col] = __float2bfloat16_rn(acc);
}

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}


struct Case {
  std::string name;
  std::vector<int> m;
  int N;
  int K;
};

// Device buffers of one problem family: A sized for `cap_rows`, B for the groups, D with guard
// rows on both sides, the reference R, the row offsets.
struct Buffers {
  int groups = 0, N = 0, K = 0, cap_rows = 0;
  int* d_off = nullptr;
  __nv_bfloat16 *A = nullptr, *B = nullptr, *D_alloc = nullptr, *D = nullptr, *R = nullptr;

  Buffers(int groups_, int N_, int K_, int cap_rows_, std::uint32_t seed)
      : groups(groups_), N(N_), K(K_), cap_rows(cap_rows_) {
    CK(cudaMalloc(&d_off, sizeof(int) * (groups + 1)));
    CK(cudaMalloc(&A, sizeof(__nv_bfloat16) * std::max<std::size_t>(1, std::size_t(cap_rows) * K)));
    CK(cudaMalloc(&B, sizeof(__nv_bfloat16) * std::max<std::size_t>(1, std::size_t(groups) * N * K)));
    CK(cudaMalloc(&D_alloc, d_bytes()));
    CK(cudaMalloc(&R, sizeof(__nv_bfloat16) * std::max<std::size_t>(1, std::size_t(cap_rows) * N)));
    D = D_alloc + std::size_t(kGuardRows) * N;
    fill_random<<<1024, 256>>>(A, std::size_t(cap_rows) * K, seed * 2 + 1);
    fill_random<<<1024, 256>>>(B, std::size_t(groups) * N * K, seed * 2 + 2);
    CK(cudaGetLastError());
  }
  ~Buffers() {
    cudaFree(d_off);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D_alloc);
    cudaFree(R);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  std::size_t d_rows() const { return std::size_t(cap_rows) + 2 * kGuardRows; }
  std::size_t d_bytes() const { return sizeof(__nv_bfloat16) * d_rows() * N; }

  // Uploads row offsets for `m` (synchronously) and computes the reference for it.
  int set_problem(const std::vector<int>& m) {
    std::vector<int> off(m.size() + 1, 0);
    for (std::size_t g = 0; g < m.size(); ++g) off[g + 1] = off[g] + m[g];
    if (int(m.size()) != groups || off.back() > cap_rows) {
      std::fprintf(stderr, "FATAL: test problem does not fit its buffers\n");
      std::exit(1);
    }
    CK(cudaMemcpy(d_off, off.data(), sizeof(int) * off.size(), cudaMemcpyHostToDevice));
    for (int g = 0; g < groups; ++g) {
      if (m[g] == 0) continue;
      const dim3 grid((N + kRefTile - 1) / kRefTile, (m[g] + kRefTile - 1) / kRefTile);
      reference_gemm<<<grid, dim3(kRefTile, kRefTile)>>>(A + std::size_t(off[g]) * K,
                                                         B + std::size_t(g) * N * K,
                                                         R + std::size_t(off[g]) * N, m[g], N, K);
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return off.back();
  }
};

// Poisons D, runs `launch` (which enqueues on `stream`), returns the whole D allocation.
std::vector<std::uint16_t> poisoned_run(Buffers& b, cudaStream_t stream,
                                        const std::function<void()>& launch) {
  CK(cudaMemsetAsync(b.D_alloc, 0xFF, b.d_bytes(), stream));
  launch();
  CK(cudaStreamSynchronize(stream));
  CK(cudaGetLastError());
  std::vector<std::uint16_t> out(b.d_rows() * b.N);
  CK(cudaMemcpy(out.data(), b.D_alloc, b.d_bytes(), cudaMemcpyDeviceToHost));
  return out;
}

// Runs twice and checks: guards untouched, all outputs finite, close to the reference, bitwise
// deterministic. Returns the first result (the whole D allocation).
std::vector<std::uint16_t> check_run(const std::string& label, Buffers& b, int total_rows,
                                     cudaStream_t stream, const std::function<void()>& launch) {
  const std::vector<std::uint16_t> d1 = poisoned_run(b, stream, launch);
  const std::vector<std::uint16_t> d2 = poisoned_run(b, stream, launch);
  const std::size_t N = std::size_t(b.N);
  const std::size_t begin = kGuardRows * N, end = begin + std::size_t(total_rows) * N;

  std::size_t guard_hits = 0;
  for (std::size_t i = 0; i < d1.size(); ++i) {
    if ((i < begin || i >= end) && d1[i] != kPoison) ++guard_hits;
  }
  std::vector<std::uint16_t> ref(std::size_t(total_rows) * N);
  if (!ref.empty()) {
    CK(cudaMemcpy(ref.data(), b.R, sizeof(std::uint16_t) * ref.size(), cudaMemcpyDeviceToHost));
  }
  double sum_sq_ref = 0.0, sum_sq_diff = 0.0, max_abs = 0.0, max_ref = 0.0;
  std::size_t non_finite = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = bf16_to_float(ref[i]);
    sum_sq_ref += r * r;
    max_ref = std::max(max_ref, std::fabs(r));
  }
  const double rms_ref = ref.empty() ? 0.0 : std::sqrt(sum_sq_ref / double(ref.size()));
  std::size_t out_of_bound = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = bf16_to_float(d1[begin + i]);
    const double r = bf16_to_float(ref[i]);
    if (!std::isfinite(d)) {
      ++non_finite;
      continue;
    }
    const double diff = std::fabs(d - r);
    sum_sq_diff += diff * diff;
    max_abs = std::max(max_abs, diff);
    // Two roundings to bf16 (u = 2^-8 each) of nearly equal fp32 sums, plus reordering slack.
    if (diff > std::ldexp(1.0, -7) * std::fabs(r) + 1e-2 * rms_ref) ++out_of_bound;
  }
  const double rel_fro = sum_sq_ref > 0 ? std::sqrt(sum_sq_diff / sum_sq_ref) : 0.0;
  const bool deterministic = std::memcmp(d1.data(), d2.data(), d1.size() * 2) == 0;

  std::printf("  %-34s rows %6d  rel_fro %.2e  max_abs %.3g (max|ref| %.3g)%s\n", label.c_str(),
              total_rows, rel_fro, max_abs, max_ref,
              (guard_hits || non_finite || out_of_bound || !deterministic || rel_fro >= 1e-2)
                  ? "  <-- FAIL"
                  : "");
  expect(guard_hits == 0, label + ": " + std::to_string(guard_hits) + " writes outside D's rows");
  expect(non_finite == 0, label + ": " + std::to_string(non_finite) + " outputs not finite");
  expect(rel_fro < 1e-2, label + ": relative Frobenius error " + std::to_string(rel_fro));
  expect(out_of_bound == 0, label + ": " + std::to_string(out_of_bound) +
                                " outputs off by more than 2^-7*|ref| + 0.01*rms(ref)");
  expect(deterministic, label + ": two runs differ bitwise");
  return d1;
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  cases.push_back({"g1 M=129 N256 K512", {129}, 256, 512});
  cases.push_back({"g1 M=1 N256 K512", {1}, 256, 512});
  cases.push_back({"g8 mixed N256 K512", {0, 1, 7, 129, 256, 0, 300, 64}, 256, 512});
  cases.push_back({"g8 zero tail N512 K256", {64, 7, 0, 0, 0, 0, 0, 0}, 512, 256});
  cases.push_back({"g8 odd N264 K520", {5, 129, 0, 200, 1, 33, 256, 77}, 264, 520});
  cases.push_back({"g4 long K N512 K4096", {128, 300, 0, 77}, 512, 4096});
  std::mt19937 rng(1234);
  std::vector<int> m64(64);
  for (int g = 0; g < 64; ++g) {
    m64[g] = (rng() % 4 == 0) ? 0 : int(rng() % 300);
  }
  m64[0] = 0;
  m64[63] = 0;
  m64[10] = 1;
  m64[11] = 7;
  m64[12] = 129;
  cases.push_back({"g64 random N512 K256", m64, 512, 256});
  cases.push_back({"g8 all M=0 N256 K512", std::vector<int>(8, 0), 256, 512});
  cases.push_back(
      {"g8 large N2048 K1024", {4096, 4095, 4097, 4096, 0, 8191, 4096, 4096}, 2048, 1024});
  return cases;
}

template <class F>
void expect_bad_input(const std::string& what, F&& f) {
  try {
    f();
    expect(false, what + ": no error thrown");
  } catch (const tilemoe::Error& e) {
    expect(e.kind() == tilemoe::ErrorKind::BadInput,
           what + ": wrong error kind (" + e.what() + ")");
  }
}

void test_config(GemmConfig config, int sms, cudaStream_t stream) {
  std::printf("config %s\n", gemm_config_name(config));
  constexpr int kMaxGroups = 64;
  GroupedGemm gemm(config, kMaxGroups, 0);
  expect(gemm.config() == config, "config() returns the configuration");
  // A half-GPU object (even, so that 2-CTA clusters fill it): results must be bitwise equal.
  const int sm_limit = (sms / 2) & ~1;
  GroupedGemm gemm_limited(config, kMaxGroups, 0, sm_limit);

  for (const Case& c : make_cases()) {
    const int groups = int(c.m.size());
    const int total = std::accumulate(c.m.begin(), c.m.end(), 0);
    Buffers b(groups, c.N, c.K, std::max(total, 1), 1000u + unsigned(groups) * 7u + unsigned(c.K));
    b.set_problem(c.m);
    auto launch = [&](GroupedGemm& g) -> std::function<void()> {
      GroupedGemm* gp = &g;
      return [&b, &c, gp, groups, stream] {
        gp->run(stream, groups, b.d_off, b.A, b.B, b.D, c.N, c.K);
      };
    };
    const auto full = check_run(c.name, b, total, stream, launch(gemm));
    if (c.N * c.K <= 512 * 512 || groups == 8) {
      const auto limited =
          check_run(c.name + " sm_limit=" + std::to_string(sm_limit), b, total, stream,
                    launch(gemm_limited));
      expect(full == limited, c.name + ": sm_limit result differs bitwise from the full grid");
    }
    if (c.name.find("large") != std::string::npos) {
      cudaEvent_t t0, t1;
      CK(cudaEventCreate(&t0));
      CK(cudaEventCreate(&t1));
      constexpr int kIters = 20;
      gemm.run(stream, groups, b.d_off, b.A, b.B, b.D, c.N, c.K);  // warm-up
      CK(cudaEventRecord(t0, stream));
      for (int i = 0; i < kIters; ++i) gemm.run(stream, groups, b.d_off, b.A, b.B, b.D, c.N, c.K);
      CK(cudaEventRecord(t1, stream));
      CK(cudaEventSynchronize(t1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      ms /= kIters;
      const double flops = 2.0 * double(total) * c.N * c.K;
      std::printf("  %-34s %.3f ms/run (setup + GEMM), %.0f TFLOP/s (information only)\n",
                  c.name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
      CK(cudaEventDestroy(t0));
      CK(cudaEventDestroy(t1));
    }
  }

  {  // groups = 0: nothing may be written
    Buffers b(1, 256, 512, 1, 77);
    const auto d = poisoned_run(b, stream, [&] { gemm.run(stream, 0, nullptr, b.A, b.B, b.D, 256, 512); });
    bool untouched = true;
    for (std::uint16_t v : d) untouched &= v == kPoison;
    std::printf("  %-34s D untouched: %s\n", "groups=0", untouched ? "yes" : "NO  <-- FAIL");
    expect(untouched, "groups = 0 wrote to D");
  }

  {  // CUDA graph: capture once, then replay with new row offsets written on the device
    const int groups = 8, N = 256, K = 512, cap = 2048;
    Buffers b(groups, N, K, cap, 4242);
    b.set_problem(std::vector<int>(groups, 16));
    // A fresh object sized for 64 groups: its first run (8 groups) re-initializes the CUTLASS
    // parameters while the stream is being captured.
    GroupedGemm graph_gemm(config, kMaxGroups, 0);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    graph_gemm.run(stream, groups, b.d_off, b.A, b.B, b.D, N, K);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<std::vector<int>> ms = {
        {0, 1, 7, 129, 256, 0, 300, 64}, {1000, 0, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 0, 0, 0}};
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const int total = b.set_problem(ms[i]);
      check_run("graph replay " + std::to_string(i), b, total, stream,
                [&] { CK(cudaGraphLaunch(exec, stream)); });
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }

  // The GEMM's own workspace must still be consistent after all of the above.
  CK(cudaDeviceSynchronize());
}

void test_bad_input(cudaStream_t stream) {
  std::printf("argument checks\n");
  GroupedGemm gemm(GemmConfig::Coop128x256Cluster1x2, 4, 0);
  Buffers b(4, 256, 512, 64, 9);
  b.set_problem({16, 16, 16, 16});
  expect_bad_input("N = 12", [&] { gemm.run(stream, 4, b.d_off, b.A, b.B, b.D, 12, 512); });
  expect_bad_input("N = 0", [&] { gemm.run(stream, 4, b.d_off, b.A, b.B, b.D, 0, 512); });
  expect_bad_input("K = 4", [&] { gemm.run(stream, 4, b.d_off, b.A, b.B, b.D, 256, 4); });
  expect_bad_input("A misaligned", [&] { gemm.run(stream, 4, b.d_off, b.A + 1, b.B, b.D, 256, 512); });
  expect_bad_input("B misaligned", [&] { gemm.run(stream, 4, b.d_off, b.A, b.B + 4, b.D, 256, 512); });
  expect_bad_input("D misaligned", [&] { gemm.run(stream, 4, b.d_off, b.A, b.B, b.D + 1, 256, 512); });
  expect_bad_input("groups > max_groups", [&] { gemm.run(stream, 5, b.d_off, b.A, b.B, b.D, 256, 512); });
  expect_bad_input("groups < 0", [&] { gemm.run(stream, -1, b.d_off, b.A, b.B, b.D, 256, 512); });
  expect_bad_input("null row_offset", [&] { gemm.run(stream, 4, nullptr, b.A, b.B, b.D, 256, 512); });
  expect_bad_input("max_groups = 0", [&] { GroupedGemm g(GemmConfig::Coop128x256Cluster2x1, 0, 0); });
  expect_bad_input("sm_limit = 1 < cluster", [&] { GroupedGemm g(GemmConfig::Coop128x256Cluster2x1, 4, 0, 1); });
  expect_bad_input("device 999", [&] { GroupedGemm g(GemmConfig::Coop128x256Cluster2x1, 4, 999); });
  // The object still works after rejected calls.
  const int total = b.set_problem({16, 0, 5, 40});
  check_run("after rejected calls", b, total, stream,
            [&] { gemm.run(stream, 4, b.d_off, b.A, b.B, b.D, 256, 512); });
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (!sm90_device_or_skip(prop, "the grouped GEMM")) return 77;
  tilemoe::gpu_checks::print_failures_only();  // hundreds of checks: a line for each failure
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    for (GemmConfig c : kAllGemmConfigs) {
      test_config(c, prop.multiProcessorCount, stream);
    }
    test_bad_input(stream);
  } catch (const tilemoe::Error& e) {
    tilemoe::gpu_checks::fail(std::string("unexpected tilemoe::Error: ") + e.what());
  } catch (const std::exception& e) {
    tilemoe::gpu_checks::fail(std::string("unexpected exception: ") + e.what());
  }
  CK(cudaStreamDestroy(stream));
  return tilemoe::gpu_checks::verdict();
}
