// Multi-process launch: who am I (torchrun- or mpirun-style environment), and a TCP rendezvous
// through rank 0 that all-gathers a small blob from every rank (to share an NCCL unique id or CUDA
// IPC handles). Plain host code; every wait is bounded and a missing peer is an Error naming it.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace feplb::dist {

struct LaunchEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

using GetEnv = std::function<const char*(const char*)>;

// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or Open MPI
// (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE, plus MASTER_ADDR / MASTER_PORT).
// Nothing set: a single process. Throws InputError naming a malformed or inconsistent variable.
LaunchEnv launch_env(const GetEnv& getenv);
LaunchEnv launch_env_from_process();

// Every rank calls it with its blob; every rank gets all blobs in rank order. Rank 0 listens on
// master_port; the others connect (retrying until rank 0 listens). Throws Error after
// `timeout_s` naming the ranks that never arrived (on rank 0) or the unreachable address.
std::vector<std::string> rendezvous_all_gather(const LaunchEnv& env, const std::string& blob,
                                               double timeout_s);

}  // namespace feplb::dist
