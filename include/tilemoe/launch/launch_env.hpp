#pragma once
// Where this process stands in a multi-process expert-parallel world (one process per GPU), as
// told by whatever started it: `tilemoe launch`, OpenMPI's mpirun, Slurm's srun or an MPICH /
// hydra mpiexec (PMI). Read once at start-up; tilemoe itself links no MPI, it only reads the
// variables these launchers export.
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace tilemoe::launch {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // index among the ranks of this node (which GPU to take)
  int local_size = 1;  // ranks on this node
  // Who set the values: "tilemoe launch", "OpenMPI", "Slurm", "PMI" or "single process".
  std::string source = "single process";
  // Where rank 0's rendezvous listens, host:port; empty when the environment does not say
  // (the caller's default applies, see Rendezvous).
  std::string rendezvous;
};

// Looks a variable up; nullopt when it is not set. An empty value counts as set (and is then
// rejected as not a number), so that `TILEMOE_RANK=` does not silently mean "single process".
using GetEnv = std::function<std::optional<std::string>(const char*)>;

// Sources, first match wins (a source matches when any of its per-process variables is set):
//  1. TILEMOE_RANK, TILEMOE_WORLD_SIZE, TILEMOE_LOCAL_RANK, TILEMOE_LOCAL_SIZE (tilemoe launch)
//  2. OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (OpenMPI)
//  3. SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the local size from SLURM_NTASKS_PER_NODE when
//     it is a plain number, else this node's entry of SLURM_TASKS_PER_NODE ("4(x2),3"; the
//     entry of SLURM_NODEID, the first one without it). SLURM_NTASKS alone (an salloc shell)
//     does not make a Slurm task.
//  4. PMI_RANK, PMI_SIZE (MPICH / hydra), local rank MPI_LOCALRANKID, local size
//     MPI_LOCALNRANKS (the world size, an upper bound, when only the local rank is known)
//  5. none: rank 0 of 1.
// Rank and size come as a pair; so do local rank and local size where both have variables
// (without either, the world is taken to be one node: local = global).
// The rendezvous address: TILEMOE_RENDEZVOUS (host:port), else MASTER_ADDR + MASTER_PORT (the
// PyTorch convention), else empty.
// Throws a BadInput error naming the variable and its value for a non-number, a negative
// value, rank >= size, local rank >= local size, a partial set or a malformed address.
LaunchEnv launch_env_from(const GetEnv& getenv);

// launch_env_from on this process's environment.
LaunchEnv launch_env();

// host:port split and checked: a non-empty host (IPv6 in brackets, "[::1]:29571") and a port
// in 1..65535. `what` names the origin in the error ("TILEMOE_RENDEZVOUS", "--rendezvous").
struct HostPort {
  std::string host;
  int port = 0;
};
HostPort parse_host_port(std::string_view text, std::string_view what);

}  // namespace tilemoe::launch
