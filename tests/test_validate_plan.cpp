// The plan checker must reject hand-broken plans, each with a message that names the fault.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "step_fixture.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::testing;
using ::testing::HasSubstr;

namespace {

std::vector<StepPlan> good_plans(Strategy strategy) {
  const EpWorld world = make_world({12, 9, 5}, 16, 16, 6, 2);
  const StepCase c = make_case(world, RoutingPattern::Balanced, 4);
  PlanOptions o;
  o.tile_m = 4;
  o.tile_n = 8;
  o.combine_tokens = 4;
  return compile_plan(strategy, world, c.routing, o);
}

std::string rejection(std::vector<StepPlan> plans, const std::function<void(std::vector<StepPlan>&)>& breakage) {
  breakage(plans);
  try {
    validate_plan(plans);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    return e.what();
  }
  ADD_FAILURE() << "the broken plan was accepted";
  return {};
}

std::size_t first_of(const std::vector<TaskRef>& queue, TaskKind kind) {
  for (std::size_t i = 0; i < queue.size(); ++i) {
    if (queue[i].kind == kind) return i;
  }
  return queue.size();
}

}  // namespace

TEST(ValidatePlan, AcceptsCompiledPlans) {
  for (Strategy s : {Strategy::Sequential, Strategy::TileSignal, Strategy::Comet}) EXPECT_NO_THROW(validate_plan(good_plans(s)));
}

TEST(ValidatePlan, RowNeverWritten) {
  // a dispatch segment that ships only the first row of its group: the others are never written
  const auto message = rejection(good_plans(Strategy::Sequential), [](auto& plans) {
    for (Segment& s : plans[0].segments) {
      if (s.dst == BufferId::ExpertIn && s.rows >= 2) {
        s.rows = 1;  // ships one row of its group
        s.gather_count = 1;
        return;
      }
    }
    FAIL() << "no dispatch segment of two rows";
  });
  EXPECT_THAT(message, HasSubstr("never written"));
}

TEST(ValidatePlan, RegionWrittenTwice) {
  const auto message = rejection(good_plans(Strategy::TileSignal), [](auto& plans) {
    StepPlan& p = plans[1];
    GemmTile copy = p.tiles[0];
    copy.signal_flag = kNoFlag;  // a second writer of the same rows that raises nothing
    p.tiles.push_back(copy);
    p.compute_queue.push_back({TaskKind::Gemm, static_cast<std::uint32_t>(p.tiles.size() - 1)});
  });
  EXPECT_THAT(message, HasSubstr("written twice"));
}

TEST(ValidatePlan, WaitWithoutItsSignals) {
  const auto message = rejection(good_plans(Strategy::Sequential), [](auto& plans) {
    StepPlan& p = plans[0];
    for (GemmTile& t : p.tiles) {
      if (t.layer == 1) {
        p.waits[t.wait_begin].expected += 1;  // one signal more than anyone raises
        break;
      }
    }
  });
  EXPECT_THAT(message, HasSubstr("tasks raise it"));
}

TEST(ValidatePlan, WaitNamingTheWrongPeer) {
  const auto message = rejection(good_plans(Strategy::Comet), [](auto& plans) {
    StepPlan& p = plans[2];
    FlagWait& w = p.waits[p.tiles[0].wait_begin];
    w.from_rank = (w.from_rank + 1) % 3;
  });
  EXPECT_THAT(message, HasSubstr("expects flag"));
}

TEST(ValidatePlan, ReadWithoutWaitingIsARace) {
  const auto message = rejection(good_plans(Strategy::TileSignal), [](auto& plans) {
    StepPlan& p = plans[0];
    for (Segment& s : p.segments) {
      if (s.dst == BufferId::CombineIn) {
        s.wait_count = 0;  // ships a band without waiting for its tiles
        break;
      }
    }
  });
  EXPECT_THAT(message, HasSubstr("without waiting for it (a race)"));
}

TEST(ValidatePlan, CycleOfWaitsAcrossRanks) {
  // rank 0's first dispatch waits for rank 1's first combine-send signal's flag, which
  // (transitively) needs rank 0's dispatch: a deadlock under any timing
  const auto message = rejection(good_plans(Strategy::Sequential), [](auto& plans) {
    StepPlan& p0 = plans[0];
    // find a flag on rank 0 raised by a segment of rank 1 going to CombineIn
    for (const Segment& s : plans[1].segments) {
      if (s.dst == BufferId::CombineIn && s.dest_rank == 0) {
        std::uint32_t raised = 0;
        for (const Segment& t : plans[1].segments) raised += t.dest_rank == 0 && t.dest_flag == s.dest_flag;
        p0.waits.push_back({static_cast<std::uint32_t>(s.dest_flag), raised, 1});
        Segment& first = p0.segments[p0.comm_queue[0].index];
        first.wait_begin = static_cast<std::uint32_t>(p0.waits.size() - 1);
        first.wait_count = 1;
        return;
      }
    }
    FAIL() << "no combine segment from rank 1 to rank 0";
  });
  EXPECT_THAT(message, HasSubstr("cycle"));
}

TEST(ValidatePlan, QueueOrderCanDeadlockToo) {
  // a compute queue whose first task waits for a later task of the same queue: with one
  // worker it can never proceed
  const auto message = rejection(good_plans(Strategy::Sequential), [](auto& plans) {
    StepPlan& p = plans[0];
    const std::size_t combine = first_of(p.compute_queue, TaskKind::Combine);
    std::swap(p.compute_queue[0], p.compute_queue[combine]);
  });
  EXPECT_THAT(message, HasSubstr("cycle"));
}

TEST(ValidatePlan, OutOfBounds) {
  auto plans = good_plans(Strategy::Comet);
  EXPECT_THAT(rejection(plans, [](auto& p) { p[1].segments[0].dst_row = p[1].segments[0].dst_row + 1000; }), HasSubstr("destination rows outside"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].segments[0].dest_rank = 7; }), HasSubstr("no such destination rank"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].tiles[0].col_end = 1 << 20; }), HasSubstr("columns outside"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].tiles[0].signal_flag = 1 << 20; }), HasSubstr("raises flag"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].waits[0].flag = 1 << 20; }), HasSubstr("waits for flag"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[2].combine_source_row[0] = 1 << 20; }), HasSubstr("reads CombineIn row"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].gather_rows[0] = -3; }), HasSubstr("gathers row"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].compute_queue.pop_back(); }), HasSubstr("queued 0 times"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[0].comm_queue.push_back(p[0].comm_queue[0]); }), HasSubstr("queued 2 times"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[1].rank = 0; }), HasSubstr("plan says it is rank 0"));
  EXPECT_THAT(rejection(plans, [](auto& p) { p[1].combine_weight.pop_back(); }), HasSubstr("combine tables"));
}
