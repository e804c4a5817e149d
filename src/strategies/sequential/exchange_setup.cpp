#include "exchange_setup.hpp"

#include <algorithm>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

namespace {

constexpr int kMaxAutoCtasPerPeer = 8;

}  // namespace

int choose_exchange_ctas_per_peer(const ExchangeShape& s, int requested) {
  const int resident = s.resident_ctas_per_sm * s.sm_count;
  const int fit = resident / (s.sharing * s.world);
  if (requested < 0) throw_bad_input("exchange CTAs per peer must be positive (0 = auto)");
  if (fit < 1) {
    throw_bad_input("the exchange kernels of " + std::to_string(s.sharing) + " x " + std::to_string(s.world) +
                    " ranks do not fit on one GPU");
  }
  if (requested > fit) {
    throw_bad_input(std::to_string(requested) + " exchange CTAs per peer do not fit: " + std::to_string(s.sharing) +
                    " rank(s) on these " + std::to_string(s.sm_count) + " SMs x " + std::to_string(s.world) +
                    " peers must be resident at once, at most " + std::to_string(fit) + " each");
  }
  if (requested > 0) return requested;
  // half the GPU at most, so that the waiting kernels never crowd out the ones they wait for
  return std::max(1, std::min(kMaxAutoCtasPerPeer, fit / 2));
}

}  // namespace tilemoe::cuda
