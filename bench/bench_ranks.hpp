#pragma once
// How a benchmark process takes part in its world: with `--transport nccl` it is one real rank
// of a world started by a launcher (tilemoe launch -n N, mpirun, srun), meets its peers at a
// rendezvous, and only rank 0 reports (prints and writes the JSON); otherwise the process is
// the whole world (virtual ranks) and reports itself.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "tilemoe/launch/launch_env.hpp"
#include "tilemoe/launch/rendezvous.hpp"
#include "tilemoe/cuda/nccl_world.hpp"

namespace tilemoe::bench {

struct BenchRanks {
  launch::LaunchEnv env;
  std::unique_ptr<launch::Rendezvous> rendezvous;  // real ranks only
  bool reporter = true;
  FILE* json = nullptr;  // the reporter's JSON lines, if asked for

  BenchRanks(bool real_ranks, const std::string& json_path) : env(launch::launch_env()) {
    if (real_ranks) {
      cuda::NcclWorld::check_environment();  // before anything starts NCCL
      rendezvous = std::make_unique<launch::Rendezvous>(env, env.rendezvous, std::chrono::milliseconds(60000));
      reporter = env.rank == 0;
    }
    if (!json_path.empty() && reporter) json = std::fopen(json_path.c_str(), "w");
    if (!reporter) std::freopen("/dev/null", "w", stdout);  // rank 0 reports for the world
  }
  ~BenchRanks() {
    if (json) std::fclose(json);
  }
  BenchRanks(const BenchRanks&) = delete;
  BenchRanks& operator=(const BenchRanks&) = delete;
  // this process's GPU: its local rank's with real ranks, device 0 with virtual ones
  int device() const { return rendezvous ? env.local_rank : 0; }
};

}  // namespace tilemoe::bench
