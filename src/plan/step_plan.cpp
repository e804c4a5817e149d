// StepPlan's own small functions: the names of its buffers and task kinds, and each buffer's
// size, which the plan builder, validate_plan and every executor read.
#include <string_view>

#include "tilemoe/plan.hpp"

namespace tilemoe {

std::string_view buffer_name(BufferId buffer) {
  switch (buffer) {
    case BufferId::Input: return "Input";
    case BufferId::ExpertIn: return "ExpertIn";
    case BufferId::Activation: return "Activation";
    case BufferId::ExpertOut: return "ExpertOut";
    case BufferId::CombineIn: return "CombineIn";
    case BufferId::Output: return "Output";
    case BufferId::Received: return "Received";
  }
  return "?";
}

std::string_view task_kind_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::Gemm: return "gemm";
    case TaskKind::Segment: return "segment";
    case TaskKind::Combine: return "combine";
  }
  return "?";
}

std::int64_t StepPlan::buffer_rows(BufferId buffer) const {
  switch (buffer) {
    case BufferId::Input:
    case BufferId::Output: return tokens;
    case BufferId::ExpertIn:
    case BufferId::Activation:
    case BufferId::ExpertOut: return expert_rows;
    case BufferId::CombineIn: return combine_rows;
    case BufferId::Received: return received_rows;
  }
  return 0;
}

std::int64_t StepPlan::buffer_cols(BufferId buffer) const {
  return buffer == BufferId::Activation ? ffn_hidden : hidden;
}

}  // namespace tilemoe
