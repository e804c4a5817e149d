#pragma once
// The statistic every tilemoe benchmark reports: the median of repeated timings.
#include <algorithm>
#include <vector>

namespace tilemoe {

// The upper median (the middle element after sorting); 0 for no samples.
inline double median(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace tilemoe
