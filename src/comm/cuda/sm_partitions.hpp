#pragma once
// Disjoint SM partitions of one GPU (CUDA green contexts), one per virtual rank, so that each
// rank's kernels run on its own SMs as on a GPU of its own. Through the driver API, reached by
// the runtime's entry-point query (tilemoe links no driver library).
#include <cuda_runtime.h>

#include <vector>

namespace tilemoe::cuda {

class SmPartitions {
 public:
  // `count` partitions of at least `sms_each` SMs each on `device`; bad input if the GPU
  // cannot give that many (the driver rounds partitions to its granularity, reported by sms()).
  SmPartitions(int device, int count, int sms_each);
  ~SmPartitions();
  SmPartitions(const SmPartitions&) = delete;
  SmPartitions& operator=(const SmPartitions&) = delete;

  int count() const { return static_cast<int>(contexts_.size()); }
  int sms(int i) const { return sms_[static_cast<std::size_t>(i)]; }
  // Makes partition i's context current on the calling thread: the CUDA runtime calls the
  // thread makes afterwards (streams, launches, events) use that partition's SMs.
  void enter(int i) const;

 private:
  std::vector<void*> green_;     // CUgreenCtx
  std::vector<void*> contexts_;  // CUcontext of each green context
  std::vector<int> sms_;
};

}  // namespace tilemoe::cuda
