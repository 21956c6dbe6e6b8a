// Multi-process launch: who am I (torchrun- or mpirun-style environment), a TCP rendezvous
// through rank 0 that all-gathers a small blob from every rank (to share an NCCL unique id or CUDA
// IPC handles), and sharing rank 0's id through any such all-gather (a framework's process group
// provides one). Plain host code; every wait is bounded and a missing peer is an Error naming it.
//
// Ports: the rendezvous listens on FEPLB_RENDEZVOUS_PORT (default MASTER_PORT + 1), never on
// MASTER_PORT itself, which a launcher such as torchrun already holds on rank 0 for its store.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace feplb::dist {

struct LaunchEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // the launcher's (torchrun's store); feplb never binds it
  int rendezvous_port = 0;  // rank 0's rendezvous listens here; 0: master_port + 1
};

// The port rendezvous_all_gather uses: env.rendezvous_port, or master_port + 1 when 0.
int rendezvous_port(const LaunchEnv& env);

using GetEnv = std::function<const char*(const char*)>;

// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or Open MPI
// (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE, plus MASTER_ADDR / MASTER_PORT), and
// FEPLB_RENDEZVOUS_PORT (default MASTER_PORT + 1). Nothing set: a single process. Throws
// InputError naming a malformed or inconsistent variable.
LaunchEnv launch_env(const GetEnv& getenv);
LaunchEnv launch_env_from_process();

// Every rank calls it with its blob; every rank gets all blobs in rank order. Rank 0 listens on
// rendezvous_port(env); the others connect (retrying until rank 0 listens). Throws Error after
// `timeout_s` naming the ranks that never arrived (on rank 0) or the unreachable address.
std::vector<std::string> rendezvous_all_gather(const LaunchEnv& env, const std::string& blob,
                                               double timeout_s);

// An all-gather of one blob per rank: called collectively with this rank's blob, returns every
// rank's, in rank order. A framework's process group provides one (torch.distributed's
// all_gather_object); tcp_all_gather is the rendezvous above as one. Its own timeout bounds it.
using AllGatherBlobs = std::function<std::vector<std::string>(const std::string& mine)>;

// rendezvous_all_gather(env, blob, timeout_s) as an AllGatherBlobs (copies env).
AllGatherBlobs tcp_all_gather(const LaunchEnv& env, double timeout_s);

// Shares rank 0's `root_blob` (an ncclUniqueId, `expected_bytes` long) with every rank through one
// call of `all_gather`, and returns it on every rank. Each rank's entry names `what`, its rank and
// the world size, so an all-gather that mixes groups, sizes or order is caught. Throws
// InputError for a rank outside [0, world_size) or rank 0's blob of the wrong size, and Error
// (prefixed with `what`) when the all-gather throws, returns other than `world_size` entries,
// returns an entry from another rank, world size or purpose, or rank 0's payload is not
// `expected_bytes` long.
std::string share_from_rank0(std::string_view what, int rank, int world_size,
                             const std::string& root_blob, size_t expected_bytes,
                             const AllGatherBlobs& all_gather);

}  // namespace feplb::dist
