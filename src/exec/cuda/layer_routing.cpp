#include "layer_routing.hpp"

#include <algorithm>

#include "moe_kernels.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cuda {

void validate_cuda_layer(const MoeConfig& c) {
  validate(c);
  if (c.dtype != DType::BF16) throw_bad_input("the CUDA backend stores bf16 only: use --dtype bf16");
  if (c.capacity_factor != 0.0) throw_bad_input("the CUDA backend is dropless only: use --capacity-factor 0");
  if (c.num_experts > 1024) throw_bad_input("the CUDA router handles at most 1024 experts");
}

void LayerRouting::allocate(const MoeConfig& c) {
  const auto slot_room = std::max<std::size_t>(static_cast<std::size_t>(c.tokens * c.top_k), 1);
  expert = DeviceArray<std::int32_t>(slot_room);
  sorted_expert = DeviceArray<std::int32_t>(slot_room);
  weight = DeviceArray<float>(slot_room);
  row_offset = DeviceArray<int>(static_cast<std::size_t>(c.num_experts + 1));
  slot_of_row = DeviceArray<int>(slot_room);
  row_of_slot = DeviceArray<int>(slot_room);
  error_token = DeviceArray<int>(1);
  layout_temp_bytes = tilemoe::cuda::layout_temp_bytes(static_cast<int>(slot_room), static_cast<int>(c.num_experts));
  layout_temp = DeviceArray<char>(layout_temp_bytes);
}

}  // namespace tilemoe::cuda
