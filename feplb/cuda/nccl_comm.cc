#include "feplb/cuda/nccl_comm.h"

#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "feplb/cuda/check.h"

namespace feplb::cuda {

NcclCommunicator::NcclCommunicator(const dist::LaunchEnv& env, double timeout_s) : device_(env.local_rank) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  FEPLB_CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id{};
  if (env.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    FEPLB_CHECK(r == ncclSuccess, "ncclGetUniqueId: {}", ncclGetErrorString(r));
  }
  const std::string mine = env.rank == 0 ? std::string(id.internal, sizeof(id.internal)) : std::string();
  const auto all = dist::rendezvous_all_gather(env, mine, timeout_s);
  FEPLB_CHECK(all[0].size() == sizeof(id.internal), "rank 0 sent a {} byte NCCL id", all[0].size());
  std::memcpy(id.internal, all[0].data(), sizeof(id.internal));
  // Non-blocking init so a peer that never joins is a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw Error(fmt::format("NCCL init: rank {} of {} not ready after {:.0f} s (a peer never joined?)", env.rank,
                              env.world_size, timeout_s));
    }
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    throw Error(fmt::format("NCCL init: {}", ncclGetErrorString(r)));
  }
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

void NcclCommunicator::abort() {
  if (comm_) ncclCommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

std::unique_ptr<Transport> NcclCommunicator::transport() const { return make_nccl_transport(comm_, device_); }

}  // namespace feplb::cuda
