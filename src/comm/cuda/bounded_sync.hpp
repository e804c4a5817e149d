#pragma once
// A host wait for a stream that gives up: cudaStreamSynchronize blocks for as long as the
// stream's work runs, and a collective whose peer died runs forever.
#include <cuda_runtime.h>

#include <chrono>
#include <functional>

namespace tilemoe::cuda {

// True when the stream's work is done; false when `timeout` passed first. Calls
// `keep_going()` between polls (it may throw, e.g. to report a communicator's own error).
bool wait_for_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const std::function<void()>& keep_going = {});

}  // namespace tilemoe::cuda
