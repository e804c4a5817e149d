// Launching a multi-process world: the environment each launcher leaves, the TCP rendezvous
// (ranks as threads of this process on an ephemeral loopback port) and `tilemoe launch`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <vector>

#include "tilemoe/launch/launch_env.hpp"
#include "tilemoe/launch/rendezvous.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::launch;
using namespace std::chrono_literals;
using ::testing::AnyOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv env_of(const Vars& vars) {
  return launch_env_from([&](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The message of the BadInput error that `vars` must cause.
std::string bad_input(const Vars& vars) {
  try {
    env_of(vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace

TEST(LaunchEnv, NoLauncherIsRankZeroOfOne) {
  const LaunchEnv env = env_of({{"HOME", "/root"}, {"SLURM_NTASKS", "4"}});  // an salloc shell is no task
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_size, 1);
  EXPECT_EQ(env.source, "single process");
  EXPECT_EQ(env.rendezvous, "");
}

TEST(LaunchEnv, TilemoeLaunchVariables) {
  const LaunchEnv env = env_of({{"TILEMOE_RANK", "2"}, {"TILEMOE_WORLD_SIZE", "4"}, {"TILEMOE_LOCAL_RANK", "0"},
                                {"TILEMOE_LOCAL_SIZE", "2"}, {"TILEMOE_RENDEZVOUS", "10.0.0.1:4000"}});
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_size, 2);
  EXPECT_EQ(env.source, "tilemoe launch");
  EXPECT_EQ(env.rendezvous, "10.0.0.1:4000");
}

TEST(LaunchEnv, WithoutLocalVariablesTheWorldIsOneNode) {
  const LaunchEnv env = env_of({{"TILEMOE_RANK", "3"}, {"TILEMOE_WORLD_SIZE", "4"}});
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.local_size, 4);
}

TEST(LaunchEnv, TilemoeWinsOverTheOthers) {
  const LaunchEnv env = env_of({{"TILEMOE_RANK", "1"}, {"TILEMOE_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "5"},
                                {"OMPI_COMM_WORLD_SIZE", "8"}, {"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "9"}});
  EXPECT_EQ(env.source, "tilemoe launch");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
}

TEST(LaunchEnv, OpenMpi) {
  const LaunchEnv env = env_of({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(env.source, "OpenMPI");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 4);
}

TEST(LaunchEnv, SlurmWithAPlainTasksPerNode) {
  const LaunchEnv env = env_of({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                                {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "3,5"}, {"PMI_RANK", "1"}});
  EXPECT_EQ(env.source, "Slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_size, 4);
}

TEST(LaunchEnv, SlurmTasksPerNodeList) {
  Vars vars{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "11"}, {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "4(x2),3"}};
  EXPECT_EQ(env_of(vars).local_size, 4);  // no node id: the first entry
  vars["SLURM_NTASKS_PER_NODE"] = "4,3";  // not a plain number: ignored
  vars["SLURM_NODEID"] = "1";
  EXPECT_EQ(env_of(vars).local_size, 4);
  vars["SLURM_NODEID"] = "2";
  EXPECT_EQ(env_of(vars).local_size, 3);
  vars["SLURM_NODEID"] = "3";
  EXPECT_THAT(bad_input(vars), HasSubstr("SLURM_NODEID=3 is beyond the 3 nodes of SLURM_TASKS_PER_NODE='4(x2),3'"));
  vars["SLURM_NODEID"] = "0";
  vars["SLURM_TASKS_PER_NODE"] = "4(2)";
  EXPECT_THAT(bad_input(vars), HasSubstr("SLURM_TASKS_PER_NODE='4(2)' is not a list like '4(x2),3'"));
}

TEST(LaunchEnv, PmiOfHydra) {
  LaunchEnv env = env_of({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_EQ(env.source, "PMI");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 2);
  env = env_of({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}});
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_size, 4);
  env = env_of({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
  EXPECT_EQ(env.local_rank, 3);
}

TEST(LaunchEnv, RendezvousAddress) {
  EXPECT_EQ(env_of({{"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}}).rendezvous, "node7:29500");
  EXPECT_EQ(env_of({{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "29500"}}).rendezvous, "[::1]:29500");
  EXPECT_EQ(env_of({{"TILEMOE_RENDEZVOUS", "[fe80::1]:80"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}}).rendezvous,
            "[fe80::1]:80");
  const HostPort hp = parse_host_port("[::1]:29571", "x");
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 29571);
}

TEST(LaunchEnv, EveryMistakeIsBadInputNamingTheVariableAndValue) {
  struct Case {
    Vars vars;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"TILEMOE_RANK", "one"}, {"TILEMOE_WORLD_SIZE", "2"}}, "TILEMOE_RANK='one' is not a number"},
      {{{"TILEMOE_RANK", ""}, {"TILEMOE_WORLD_SIZE", "2"}}, "TILEMOE_RANK='' is not a number"},
      {{{"TILEMOE_RANK", "1 "}, {"TILEMOE_WORLD_SIZE", "2"}}, "TILEMOE_RANK='1 ' is not a number"},
      {{{"TILEMOE_RANK", "0"}, {"TILEMOE_WORLD_SIZE", "99999999999"}}, "TILEMOE_WORLD_SIZE='99999999999' is too large"},
      {{{"TILEMOE_RANK", "-1"}, {"TILEMOE_WORLD_SIZE", "2"}}, "TILEMOE_RANK='-1' is negative"},
      {{{"TILEMOE_RANK", "2"}, {"TILEMOE_WORLD_SIZE", "2"}}, "TILEMOE_RANK=2 is not below TILEMOE_WORLD_SIZE=2"},
      {{{"TILEMOE_RANK", "0"}, {"TILEMOE_WORLD_SIZE", "0"}}, "TILEMOE_WORLD_SIZE=0 must be at least 1"},
      {{{"TILEMOE_RANK", "1"}}, "TILEMOE_RANK is set but TILEMOE_WORLD_SIZE is not"},
      {{{"TILEMOE_WORLD_SIZE", "2"}}, "TILEMOE_WORLD_SIZE is set but TILEMOE_RANK is not"},
      {{{"TILEMOE_LOCAL_RANK", "0"}}, "TILEMOE_LOCAL_RANK is set but TILEMOE_RANK and TILEMOE_WORLD_SIZE are not"},
      {{{"TILEMOE_RANK", "1"}, {"TILEMOE_WORLD_SIZE", "2"}, {"TILEMOE_LOCAL_RANK", "1"}},
       "TILEMOE_LOCAL_RANK is set but TILEMOE_LOCAL_SIZE is not"},
      {{{"TILEMOE_RANK", "1"}, {"TILEMOE_WORLD_SIZE", "4"}, {"TILEMOE_LOCAL_RANK", "2"}, {"TILEMOE_LOCAL_SIZE", "2"}},
       "TILEMOE_LOCAL_RANK=2 is not below TILEMOE_LOCAL_SIZE=2"},
      {{{"TILEMOE_RANK", "1"}, {"TILEMOE_WORLD_SIZE", "2"}, {"TILEMOE_LOCAL_RANK", "1"}, {"TILEMOE_LOCAL_SIZE", "3"}},
       "TILEMOE_LOCAL_SIZE=3 exceeds TILEMOE_WORLD_SIZE=2"},
      {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK=3 is not below OMPI_COMM_WORLD_SIZE=2"},
      {{{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK='x' is not a number"},
      {{{"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_PROCID is set but SLURM_NTASKS is not"},
      {{{"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "2"}}, "SLURM_LOCALID is set but SLURM_PROCID is not"},
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID=4 is not below SLURM_NTASKS=4"},
      {{{"SLURM_PROCID", "-2"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID='-2' is negative"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "2"}},
       "SLURM_LOCALID=2 is not below SLURM_NTASKS_PER_NODE=2"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "two"}},
       "SLURM_TASKS_PER_NODE='two' is not a number"},
      {{{"PMI_RANK", "1"}}, "PMI_RANK is set but PMI_SIZE is not"},
      {{{"PMI_RANK", "1"}, {"PMI_SIZE", "1"}}, "PMI_RANK=1 is not below PMI_SIZE=1"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "z"}}, "MPI_LOCALRANKID='z' is not a number"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALNRANKS", "1"}}, "MPI_LOCALNRANKS is set but MPI_LOCALRANKID is not"},
      {{{"TILEMOE_RENDEZVOUS", "localhost"}}, "TILEMOE_RENDEZVOUS='localhost' is not host:port"},
      {{{"TILEMOE_RENDEZVOUS", ":29571"}}, "TILEMOE_RENDEZVOUS=':29571' has an empty host"},
      {{{"TILEMOE_RENDEZVOUS", "h:0"}}, "TILEMOE_RENDEZVOUS='h:0' has no valid port"},
      {{{"TILEMOE_RENDEZVOUS", "h:70000"}}, "TILEMOE_RENDEZVOUS='h:70000' has no valid port"},
      {{{"TILEMOE_RENDEZVOUS", "::1:80"}}, "write an IPv6 address in brackets"},
      {{{"MASTER_ADDR", "node7"}}, "MASTER_ADDR is set but MASTER_PORT is not"},
      {{{"MASTER_PORT", "29500"}}, "MASTER_PORT is set but MASTER_ADDR is not"},
      {{{"MASTER_ADDR", "node7"}, {"MASTER_PORT", "http"}}, "MASTER_ADDR/MASTER_PORT='node7:http' has no valid port"},
  };
  for (const Case& c : cases) EXPECT_THAT(bad_input(c.vars), HasSubstr(c.message)) << c.message;
}

// ---- the rendezvous, ranks as threads ----

namespace {

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> out;
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  return out;
}

std::string text_of(const std::vector<std::byte>& bytes) { return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()); }

LaunchEnv rank_of(int rank, int world) {
  LaunchEnv env;
  env.rank = rank;
  env.world_size = world;
  env.source = "the test";
  return env;
}

std::string loopback() { return "127.0.0.1:" + std::to_string(pick_free_port()); }

// Runs `body(rank)` on a thread per rank; returns what each threw ("" for nothing).
template <typename Body>
std::vector<std::string> run_ranks(int world, Body body, const std::vector<int>& ranks = {}) {
  std::vector<int> who = ranks;
  if (who.empty()) {
    for (int r = 0; r < world; ++r) who.push_back(r);
  }
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r : who) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(r)] = std::string(e.kind() == ErrorKind::Timeout    ? "[timeout] "
                                                          : e.kind() == ErrorKind::BadInput ? "[bad input] "
                                                                                            : "[internal] ") +
                                              e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

class RendezvousWorld : public ::testing::TestWithParam<int> {};

TEST_P(RendezvousWorld, BroadcastAllGatherAndBarrier) {
  const int world = GetParam();
  const std::string address = loopback();
  std::vector<std::vector<std::byte>> broadcast(static_cast<std::size_t>(world));
  std::vector<std::vector<std::vector<std::byte>>> gathered(static_cast<std::size_t>(world));
  std::vector<std::byte> unique_id(128);
  for (std::size_t i = 0; i < unique_id.size(); ++i) unique_id[i] = static_cast<std::byte>(i * 7 + 1);
  const auto errors = run_ranks(world, [&](int r) {
    Rendezvous rv(rank_of(r, world), address, 5s);
    EXPECT_EQ(rv.rank(), r);
    EXPECT_EQ(rv.world_size(), world);
    // Only rank 0's bytes count: the others pass garbage.
    const std::vector<std::byte> mine = r == 0 ? unique_id : bytes_of("not the root");
    broadcast[static_cast<std::size_t>(r)] = rv.broadcast_from_root(mine);
    gathered[static_cast<std::size_t>(r)] = rv.all_gather(bytes_of(std::string(static_cast<std::size_t>(r), 'x') + "rank " + std::to_string(r)));
    rv.barrier();
    rv.barrier();
    const auto empty = rv.all_gather({});
    EXPECT_EQ(empty.size(), static_cast<std::size_t>(world));
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(broadcast[static_cast<std::size_t>(r)], unique_id) << "rank " << r;
    ASSERT_EQ(gathered[static_cast<std::size_t>(r)].size(), static_cast<std::size_t>(world));
    for (int q = 0; q < world; ++q) {
      EXPECT_EQ(text_of(gathered[static_cast<std::size_t>(r)][static_cast<std::size_t>(q)]),
                std::string(static_cast<std::size_t>(q), 'x') + "rank " + std::to_string(q));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RendezvousWorld, ::testing::Values(1, 2, 4));

TEST(Rendezvous, LargePayloadsArriveWhole) {
  const std::string address = loopback();
  std::vector<std::byte> big(3 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 131 % 251);
  const auto errors = run_ranks(3, [&](int r) {
    Rendezvous rv(rank_of(r, 3), address, 5s);
    EXPECT_EQ(rv.broadcast_from_root(r == 0 ? big : std::vector<std::byte>{}), big);
    const auto all = rv.all_gather(big);
    for (const auto& part : all) EXPECT_EQ(part, big);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Rendezvous, TheDefaultAddressIsLoopback) {
  EXPECT_STREQ(kDefaultRendezvous, "127.0.0.1:29571");
  Rendezvous alone(rank_of(0, 1), "", 1s);  // a world of one opens no socket
  EXPECT_EQ(alone.address(), "127.0.0.1:29571");
  EXPECT_EQ(alone.broadcast_from_root(bytes_of("id")), bytes_of("id"));
}

TEST(Rendezvous, ARankThatNeverComesIsATimeoutNamingIt) {
  const std::string address = loopback();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(4, [&](int r) { Rendezvous rv(rank_of(r, 4), address, 300ms); }, {0, 1});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(errors[0], HasSubstr("[timeout] rendezvous at " + address + ": rank 0 waited 0.3 s for ranks 2, 3 to connect"));
  // Rank 1 learns from rank 0 who is missing.
  EXPECT_THAT(errors[1], HasSubstr("[timeout] rendezvous at " + address + ": rank 0 gave up: rank 0 waited 0.3 s for ranks 2, 3"));
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
}

TEST(Rendezvous, NoRankZeroIsATimeoutOfTheConnect) {
  const std::string address = loopback();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](int r) { Rendezvous rv(rank_of(r, 2), address, 300ms); }, {1});
  EXPECT_THAT(errors[1], HasSubstr("[timeout] rendezvous at " + address + ": rank 1 waited 0.3 s to connect to rank 0"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(Rendezvous, AWorldSizeMismatchIsRejectedOnBothSides) {
  const std::string address = loopback();
  const auto errors = run_ranks(2, [&](int r) { Rendezvous rv(rank_of(r, r == 0 ? 2 : 3), address, 2s); });
  EXPECT_THAT(errors[0], HasSubstr("[bad input] rendezvous at " + address + ": rank 1 (from 127.0.0.1:"));
  EXPECT_THAT(errors[0], HasSubstr("belongs to a world of 3 ranks, rank 0's has 2"));
  EXPECT_THAT(errors[1], HasSubstr("[bad input] rendezvous at " + address + ": rank 0 gave up: rank 1"));
}

TEST(Rendezvous, ADuplicateRankIsRejected) {
  const std::string address = loopback();
  // Two threads both claim rank 1 of 3; rank 2 never comes, so rank 0 sees both claims.
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      try {
        Rendezvous rv(rank_of(i == 0 ? 0 : 1, 3), address, 2s);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(errors[0], HasSubstr("two processes claim rank 1 (from 127.0.0.1:"));
  EXPECT_THAT(errors[1], HasSubstr("two processes claim rank 1"));
  EXPECT_THAT(errors[2], HasSubstr("two processes claim rank 1"));
}

TEST(Rendezvous, APeerThatLeavesMidProtocolIsNamed) {
  const std::string address = loopback();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, [&](int r) {
    Rendezvous rv(rank_of(r, 3), address, 3s);
    rv.barrier();
    if (r == 2) return;  // leaves: its destructor closes the connection
    rv.all_gather(bytes_of("x"));
  });
  EXPECT_THAT(errors[0], HasSubstr("[timeout] rendezvous at " + address +
                                   ": rank 2 closed the connection while rank 0 waited for it to enter all_gather #1"));
  EXPECT_THAT(errors[1], HasSubstr("rank 0 gave up: rank 2 closed the connection"));
  EXPECT_EQ(errors[2], "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);  // found by the EOF, not a timeout
}

TEST(Rendezvous, ARankInAnotherCollectiveIsInternal) {
  const std::string address = loopback();
  const auto errors = run_ranks(2, [&](int r) {
    Rendezvous rv(rank_of(r, 2), address, 2s);
    if (r == 0) {
      rv.barrier();
    } else {
      rv.all_gather(bytes_of("x"));
    }
  });
  EXPECT_THAT(errors[0], HasSubstr("[internal] rendezvous at " + address + ": rank 0 is in barrier #0 but rank 1 entered all_gather #0"));
  EXPECT_THAT(errors[1], HasSubstr("[internal] rendezvous at " + address + ": rank 0 gave up: rank 0 is in barrier #0"));
}

TEST(Rendezvous, AStalledPeerIsATimeoutNamingIt) {
  const std::string address = loopback();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, [&](int r) {
    Rendezvous rv(rank_of(r, 3), address, 300ms);
    if (r == 1) std::this_thread::sleep_for(600ms);  // still alive, but late
    rv.barrier();
  });
  EXPECT_THAT(errors[0], HasSubstr("[timeout] rendezvous at " + address + ": rank 0 waited 0.3 s for rank 1 to enter barrier #0"));
  EXPECT_THAT(errors[2], HasSubstr("rank 0 gave up: rank 0 waited 0.3 s for rank 1"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(Rendezvous, AStrangerOnThePortIsRejected) {
  const std::string address = loopback();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::string error;
  std::thread root([&] {
    try {
      Rendezvous rv(rank_of(0, 2), address, 2s);
    } catch (const Error& e) {
      error = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::Internal);
    }
  });
  // Something that is no tilemoe: connects and writes an HTTP request.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 200 && ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0; ++i) std::this_thread::sleep_for(10ms);
  const char request[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(::send(fd, request, sizeof request - 1, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof request - 1));
  root.join();
  ::close(fd);
  EXPECT_THAT(error, HasSubstr("a connection from 127.0.0.1:"));
  EXPECT_THAT(error, HasSubstr("does not speak the tilemoe rendezvous protocol"));
}

TEST(Rendezvous, APortInUseIsBadInputNamingIt) {
  // Another listener holds the port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof at;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &length);
  const int port = ntohs(at.sin_port);
  try {
    Rendezvous rv(rank_of(0, 2), "127.0.0.1:" + std::to_string(port), 1s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_THAT(e.what(), HasSubstr("port " + std::to_string(port) + " is already in use"));
  }
  ::close(fd);
}

TEST(Rendezvous, NoDescriptorLeaksOnFailure) {
  const auto open_fds = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const int before = open_fds();
  const std::string address = loopback();
  run_ranks(3, [&](int r) { Rendezvous rv(rank_of(r, 3), address, 200ms); }, {0, 1});
  run_ranks(2, [&](int r) { Rendezvous rv(rank_of(r, 2), address, 200ms); }, {1});
  run_ranks(2, [&](int r) {
    Rendezvous rv(rank_of(r, 2), address, 2s);
    rv.barrier();
  });
  EXPECT_EQ(open_fds(), before);
}

// ---- tilemoe launch, through the built binary ----

namespace {

struct CliRun {
  int code = -1;
  std::string out, err;
  std::chrono::steady_clock::duration took{};
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `args` as a shell would pass them (quoted by the caller).
CliRun tilemoe_cli(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("tilemoe_launch_" + std::to_string(::getpid()) + "_" +
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system((std::string(TILEMOE_CLI) + " " + args + " >" + out + " 2>" + err).c_str());
  CliRun r;
  r.took = std::chrono::steady_clock::now() - start;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove_all(dir);
  return r;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace

TEST(LaunchCli, EveryRankGetsItsPlace) {
  const CliRun r = tilemoe_cli("launch -n 3 -- sh -c 'echo $TILEMOE_RANK/$TILEMOE_WORLD_SIZE'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"0/3", "1/3", "2/3"}));
  EXPECT_EQ(r.err, "");
}

TEST(LaunchCli, TheChildrenReadTheirEnvironmentAsTilemoeLaunch) {
  const CliRun r = tilemoe_cli(
      "launch -n 2 --rendezvous 127.0.0.1:4567 -- sh -c "
      "'echo $TILEMOE_RANK $TILEMOE_LOCAL_RANK $TILEMOE_LOCAL_SIZE $TILEMOE_RENDEZVOUS'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"0 0 2 127.0.0.1:4567", "1 1 2 127.0.0.1:4567"}));
  // Without --rendezvous: loopback and a port picked for this world.
  const CliRun d = tilemoe_cli("launch -n 1 -- sh -c 'echo $TILEMOE_RENDEZVOUS'");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, ::testing::MatchesRegex("127\\.0\\.0\\.1:[0-9]+\n"));
}

TEST(LaunchCli, AFailingRankStopsTheWorldAndGivesItsCode) {
  // Rank 1 fails; its siblings would sleep for a minute and must be stopped promptly.
  const CliRun r = tilemoe_cli("launch -n 3 -- sh -c 'if [ $TILEMOE_RANK = 1 ]; then sleep 0.2; exit 3; fi; sleep 60'");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 exited with code 3"));
  EXPECT_THAT(r.err, HasSubstr("stopping ranks 0, 2 (SIGTERM)"));
  EXPECT_LT(r.took, 4s);
}

TEST(LaunchCli, ARankKilledByASignalIsNamedAndExitsOne) {
  const CliRun r = tilemoe_cli("launch -n 2 -- sh -c 'if [ $TILEMOE_RANK = 0 ]; then kill -SEGV $$; fi; sleep 60'");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 0 was killed by signal SIGSEGV"));
  EXPECT_LT(r.took, 4s);
}

TEST(LaunchCli, TheTimeoutStopsAWorldThatRunsTooLong) {
  const CliRun r = tilemoe_cli("launch -n 2 --timeout-s 0.3 -- sleep 60");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("did not finish within --timeout-s 0.3; ranks 0, 1 still running"));
  EXPECT_LT(r.took, 4s);
}

TEST(LaunchCli, AProgramThatCannotRunIsNamed) {
  const CliRun r = tilemoe_cli("launch -n 2 -- tilemoe-no-such-program --flag");
  EXPECT_EQ(r.code, 127);
  EXPECT_THAT(r.err, HasSubstr("cannot execute 'tilemoe-no-such-program': No such file or directory"));
}

TEST(LaunchCli, BadArgumentsExitWithTwo) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"launch -n 0 -- true", "-n 0 is outside 1..64"},
      {"launch -n 65 -- true", "-n 65 is outside 1..64"},
      {"launch -n two -- true", "two"},
      {"launch -- true", "--ranks is required"},
      {"launch -n 2", "no program to start"},
      {"launch -n 2 --timeout-s -1 -- true", "--timeout-s"},
      {"launch -n 2 --rendezvous nohost -- true", "--rendezvous='nohost' is not host:port"},
      {"launch -n 2 --rendezvous h:99999 -- true", "has no valid port"},
  };
  for (const Case& c : cases) {
    const CliRun r = tilemoe_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
  }
}

TEST(LaunchCli, AnUnknownCommandListsLaunch) {
  const CliRun r = tilemoe_cli("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("use run, bench, validate-plan or launch"));
}

// A rank of the world below: run by `tilemoe launch` (which sets TILEMOE_RANK), skipped
// otherwise. It joins through its environment and checks what the others sent.
TEST(LaunchChild, JoinsTheWorldOfItsEnvironment) {
  if (!std::getenv("TILEMOE_RANK")) GTEST_SKIP() << "only run as a rank of tilemoe launch";
  const LaunchEnv env = launch_env();
  ASSERT_EQ(env.source, "tilemoe launch");
  Rendezvous rv(env, env.rendezvous, 10s);
  const auto id = rv.broadcast_from_root(bytes_of("unique id of rank " + std::to_string(env.rank)));
  EXPECT_EQ(text_of(id), "unique id of rank 0");
  const auto all = rv.all_gather(bytes_of(std::to_string(env.rank * 10)));
  std::string seen;
  for (const auto& part : all) seen += text_of(part) + ",";
  rv.barrier();
  std::printf("rank %d of %d saw %s\n", env.rank, env.world_size, seen.c_str());
}

TEST(LaunchCli, RanksMeetAtTheRendezvous) {
  // The whole path: tilemoe launch, launch_env in each rank, the rendezvous between them. The
  // ranks are this test program, running the test above.
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const CliRun r = tilemoe_cli("launch -n 3 -- " + self + " --gtest_filter=LaunchChild.JoinsTheWorldOfItsEnvironment");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank) EXPECT_THAT(r.out, HasSubstr("rank " + std::to_string(rank) + " of 3 saw 0,10,20,"));
  EXPECT_LT(r.took, 10s);
}
