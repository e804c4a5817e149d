#pragma once
// The strategies tilemoe implements, one per published system (src/strategies/<system>/), and
// `auto`, which lets a GPU layer pick among them for its shape.
#include <cstdint>
#include <string_view>

namespace tilemoe {

// Sequential: dispatch all-to-all, all expert FFNs, combine all-to-all (Megatron / Tutel).
// TileSignal: GEMM1 raises a flag per row band, remote bands first, and a consumer ships each
//             band as soon as it is ready (ICPP 2026); bitwise the sequential output.
// Comet:      token-split layer 0, column-split layer 1 (MLSys 2025).
// Auto:       a GPU layer runs TileSignal with the cost model's split where the model sees it
//             win for the layer's shape (src/strategies/tile_signal/split_model.hpp), else
//             Sequential. Not a plan compiler: the CPU engine runs named strategies.
enum class Strategy : std::uint8_t { Sequential, TileSignal, Comet, Auto };
std::string_view strategy_name(Strategy strategy);  // "sequential", "tile_signal", "comet", "auto"
Strategy parse_strategy(std::string_view name);     // bad input for an unknown name

}  // namespace tilemoe
