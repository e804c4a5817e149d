#pragma once
// The bootstrap of a multi-process world: the few bytes every rank must agree on before a
// communicator exists (the 128-byte ncclUniqueId that rank 0 draws, host names, device ids).
// A star over TCP: rank 0 listens, the others connect to it; plain POSIX sockets, so tilemoe
// needs neither MPI nor a key-value store to start.
//
// Every wait is bounded: a rank that never connects, dies or stalls turns into a Timeout
// error naming the rank(s) and what was awaited; a peer speaking another protocol version is
// Internal; a world that does not fit (another world size, a rank claimed twice, the port
// taken) is BadInput. When rank 0 fails after peers joined, it tells them why before it
// closes, so every rank's error names the culprit, not only rank 0's.
//
// The collectives must be called in the same order on every rank (like MPI's); a rank that
// calls another one is detected and reported (Internal).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tilemoe/launch/launch_env.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::launch {

// Used when neither the caller nor the environment names an address. It is on loopback, so
// rank 0 listens on 127.0.0.1 only: a world spanning several nodes needs an explicit
// address of rank 0's node (TILEMOE_RENDEZVOUS, MASTER_ADDR/MASTER_PORT or --rendezvous).
inline constexpr const char* kDefaultRendezvous = "127.0.0.1:29571";

class Rendezvous {
 public:
  // Joins the world of `env` (rank, world_size) at `address` (host:port; kDefaultRendezvous
  // when empty). Rank 0 binds to that host and accepts world_size - 1 peers; the others
  // connect, retrying until it listens. Returns once all ranks have joined, or throws.
  // Rank 0 waits at most `timeout` for each step (joining, each collective); the other ranks
  // wait for rank 0 a quarter longer (0.5 s to 5 s more), so that rank 0's verdict, which
  // names the rank at fault, reaches them before their own timer expires. A world of one
  // opens no socket.
  Rendezvous(const LaunchEnv& env, std::string address, std::chrono::milliseconds timeout);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& address() const { return address_; }

  // Every rank receives rank 0's bytes; `root_bytes` is read on rank 0 only.
  std::vector<std::byte> broadcast_from_root(std::span<const std::byte> root_bytes);
  // Every rank receives every rank's bytes, indexed by rank (sizes may differ).
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine);
  // Returns once every rank has entered it.
  void barrier();

 private:
  void join_as_root();
  void join_as_peer();
  void check_usable(const char* what) const;
  // Rank 0's half of a collective: one frame from every peer, checked to be the same
  // collective; index 0 holds `mine`.
  std::vector<std::vector<std::byte>> root_gather(std::uint16_t op, std::span<const std::byte> mine,
                                                  std::chrono::steady_clock::time_point deadline);
  void root_send_to_all(std::uint16_t op, std::span<const std::byte> payload, std::chrono::steady_clock::time_point deadline);
  void peer_send(std::uint16_t op, std::span<const std::byte> payload, std::chrono::steady_clock::time_point deadline);
  std::vector<std::byte> peer_receive(std::uint16_t op, const std::string& awaited, std::chrono::steady_clock::time_point deadline);
  // How long ranks > 0 wait for rank 0 (see the constructor).
  std::chrono::milliseconds peer_wait() const;
  // Rank 0: tells every connected peer (and `extra_fd`, a connection not yet admitted) why,
  // closes everything and throws. Other ranks: close and throw.
  [[noreturn]] void fail(ErrorKind kind, const std::string& reason, int extra_fd = -1);
  void close_all();

  int rank_ = 0;
  int world_size_ = 1;
  std::string address_;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  std::string source_;
  std::uint32_t sequence_ = 0;  // the collective's number, the same on every rank
  bool failed_ = false;
  int root_fd_ = -1;            // on ranks > 0: the connection to rank 0
  std::vector<int> peer_fds_;   // on rank 0: index r holds rank r's connection (r > 0)
};

// A TCP port of `host` that was free a moment ago: binds port 0, reads the port, closes. For
// picking a rendezvous address before starting the ranks (tilemoe launch, tests); another
// process may take it in between, which rank 0 then reports as a port in use.
int pick_free_port(const std::string& host = "127.0.0.1");

}  // namespace tilemoe::launch
