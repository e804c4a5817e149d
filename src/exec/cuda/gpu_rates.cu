#include "gpu_rates.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tilemoe/cuda/cuda_check.hpp"
#include "tilemoe/cuda/device_array.hpp"
#include "core/cuda/event_timing.hpp"
#include "exec/cuda/row_copy.cuh"
#include "kernels/moe_kernels.hpp"
#include "kernels/gemm/planned/planned_gemm.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kCopyCtas = 8;
constexpr int kCopyThreads = 512;  // the consumer's CTA
constexpr int kRowBytes = 14336;   // a DeepSeek-V3 row

// The consumer's copy loop (a warp per row) on device-local rows.
__global__ void __launch_bounds__(kCopyThreads) copy_rows_kernel(const std::byte* src, std::byte* dst, int rows) {
  const int warps = kCopyThreads / 32, warp = static_cast<int>(blockIdx.x) * warps + static_cast<int>(threadIdx.x) / 32;
  for (int r = warp; r < rows; r += warps * static_cast<int>(gridDim.x)) {
    copy_row(dst + static_cast<std::size_t>(r) * kRowBytes, src + static_cast<std::size_t>(r) * kRowBytes, kRowBytes, threadIdx.x % 32);
  }
}

}  // namespace

double device_copy_gbps(cudaStream_t stream) {
  const std::size_t bytes = std::size_t(4) << 30;
  DeviceArray<std::byte> src(bytes), dst(bytes);
  TILEMOE_CUDA_CHECK(cudaMemsetAsync(src.data(), 1, bytes, stream));
  const float ms = median_event_ms(stream, 10, 3, [&] {
    TILEMOE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;  // read + write
}

GpuRates calibrate_gpu_rates(int device) {
  TILEMOE_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  TILEMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  GpuRates rates;
  rates.sms = prop.multiProcessorCount;
  rates.gpu = std::string(prop.name) + ", " + std::to_string(rates.sms) + " SMs";
  cudaStream_t stream;
  TILEMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    // a grouped GEMM of the layer's kind: 8 groups x 1024 rows, N = K = 4096, random data
    const int groups = 8, rows = 1024, N = 4096, K = 4096;
    DeviceArray<__nv_bfloat16> A(static_cast<std::size_t>(groups) * rows * K), B(static_cast<std::size_t>(groups) * N * K),
        D(static_cast<std::size_t>(groups) * rows * N);
    launch_random_bf16(stream, A.data(), A.count(), 11, 1.0f);
    launch_random_bf16(stream, B.data(), B.count(), 12, 0.02f);
    std::vector<int> offsets;
    for (int g = 0; g <= groups; ++g) offsets.push_back(g * rows);
    const std::vector<GemmTileEntry> host = build_tile_table(offsets, N, PlannedCluster::N2, TileFlags::None);
    DeviceArray<GemmTileEntry> table(host.data(), host.size());
    const int count_host = static_cast<int>(host.size());
    DeviceArray<int> count(&count_host, 1);
    PlannedGemm gemm(PlannedCluster::N2, PlannedEpilogue::Store, groups, device);
    PlannedGemmRun run;
    run.table = table.data();
    run.count = count.data();
    run.A = A.data();
    run.a_rows = groups * rows;
    run.B = B.data();
    run.groups = groups;
    run.D = D.data();
    run.N = N;
    run.K = K;
    const float ms = median_event_ms(stream, 5, 2, [&] { gemm.run(stream, run); });
    rates.gemm_flops_per_sm = 2.0 * groups * rows * double(N) * K / (ms * 1e-3) / rates.sms;
  }
  {
    const int rows = 16384;  // 235 MB
    DeviceArray<std::byte> src(static_cast<std::size_t>(rows) * kRowBytes), dst(static_cast<std::size_t>(rows) * kRowBytes);
    TILEMOE_CUDA_CHECK(cudaMemsetAsync(src.data(), 1, src.count(), stream));
    const float ms = median_event_ms(stream, 5, 2, [&] {
      copy_rows_kernel<<<kCopyCtas, kCopyThreads, 0, stream>>>(src.data(), dst.data(), rows);
      TILEMOE_CUDA_CHECK_LAUNCH("calibration copy");
    });
    rates.copy_bytes_per_cta = double(rows) * kRowBytes / (ms * 1e-3) / kCopyCtas;
  }
  TILEMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  TILEMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  return rates;
}

const GpuRates& gpu_rates(int device) {
  static std::once_flag once;
  static GpuRates rates;
  std::call_once(once, [&] {
    cudaDeviceProp prop;
    TILEMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const std::string key = std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs";
    const std::string path = default_rates_path();
    if (auto cached = load_rates(path, key)) {
      rates = *cached;
      return;
    }
    // on a thread of its own: one bound to nothing uses the whole GPU (the caller may be a
    // virtual rank inside an SM partition, which would measure its partition's share)
    std::exception_ptr error;
    std::thread calibrate([&] {
      try {
        rates = calibrate_gpu_rates(device);
      } catch (...) {
        error = std::current_exception();
      }
    });
    calibrate.join();
    if (error) std::rethrow_exception(error);
    try {
      save_rates(path, rates);
    } catch (const Error&) {
      // no cache: the next process calibrates again
    }
  });
  return rates;
}

}  // namespace tilemoe::cuda
