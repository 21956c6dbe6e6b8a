#include "feplb/cuda/nccl_comm.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "feplb/cuda/base/check.h"

namespace feplb::cuda {

namespace {

// ncclCommInitRankConfig with `id`, non-blocking so a peer that never joins is a timeout, not a
// hang: the communicator is aborted after `timeout_s`. On the current device.
ncclComm_t init_nonblocking(const ncclUniqueId& id, int rank, int world_size, double timeout_s) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw Error(
          fmt::format("NCCL init: rank {} of {} not ready after {:.0f} s (a peer never joined?)",
                      rank, world_size, timeout_s));
    }
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    throw Error(fmt::format("NCCL init: {}", ncclGetErrorString(r)));
  }
  return comm;
}

}  // namespace

NcclCommunicator NcclCommunicator::borrow(ncclComm* comm) {
  FEPLB_REQUIRE_INPUT(comm != nullptr, "NcclCommunicator::borrow: the communicator is null");
  int device = -1;
  const ncclResult_t r = ncclCommCuDevice(comm, &device);
  FEPLB_CHECK(r == ncclSuccess, "ncclCommCuDevice: {}", ncclGetErrorString(r));
  NcclCommunicator c;
  c.comm_ = comm;
  c.device_ = device;
  c.owned_ = false;
  return c;
}

NcclCommunicator::NcclCommunicator(int rank, int world_size, int device,
                                   const dist::AllGatherBlobs& all_gather, double timeout_s)
    : device_(device) {
  FEPLB_REQUIRE_INPUT(timeout_s > 0, "NCCL init: timeout {} s is not positive", timeout_s);
  FEPLB_CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    FEPLB_CHECK(r == ncclSuccess, "ncclGetUniqueId: {}", ncclGetErrorString(r));
  }
  const std::string mine =
      rank == 0 ? std::string(id.internal, sizeof(id.internal)) : std::string();
  const std::string root = dist::share_from_rank0("feplb-nccl-unique-id", rank, world_size, mine,
                                                  sizeof(id.internal), all_gather);
  std::memcpy(id.internal, root.data(), sizeof(id.internal));
  comm_ = init_nonblocking(id, rank, world_size, timeout_s);
}

NcclCommunicator NcclCommunicator::from_unique_id(const char* id_bytes, int rank, int world_size,
                                                  int device, double timeout_s) {
  FEPLB_REQUIRE_INPUT(id_bytes != nullptr, "NCCL init: the unique id is null");
  FEPLB_REQUIRE_INPUT(world_size >= 1 && rank >= 0 && rank < world_size, "NCCL init: rank {} of {}",
                      rank, world_size);
  FEPLB_REQUIRE_INPUT(timeout_s > 0, "NCCL init: timeout {} s is not positive", timeout_s);
  FEPLB_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id{};
  static_assert(sizeof(id.internal) == kUniqueIdBytes, "NCCL unique ids are 128 bytes");
  std::memcpy(id.internal, id_bytes, sizeof(id.internal));
  NcclCommunicator c;
  c.device_ = device;
  c.comm_ = init_nonblocking(id, rank, world_size, timeout_s);
  return c;
}

NcclCommunicator::NcclCommunicator(const dist::LaunchEnv& env, double timeout_s)
    : NcclCommunicator(env.rank, env.world_size, env.local_rank,
                       dist::tcp_all_gather(env, timeout_s), timeout_s) {}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ && owned_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

NcclCommunicator::NcclCommunicator(NcclCommunicator&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)), device_(other.device_), owned_(other.owned_) {}

NcclCommunicator& NcclCommunicator::operator=(NcclCommunicator&& other) noexcept {
  if (this != &other) {
    if (comm_ && owned_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
    comm_ = std::exchange(other.comm_, nullptr);
    device_ = other.device_;
    owned_ = other.owned_;
  }
  return *this;
}

void* NcclCommunicator::release() { return std::exchange(comm_, nullptr); }

void NcclCommunicator::abort() {
  if (comm_ && owned_) ncclCommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

std::unique_ptr<Transport> NcclCommunicator::transport() const {
  FEPLB_REQUIRE_INPUT(comm_ != nullptr, "NcclCommunicator: aborted or moved from; no transport");
  return make_nccl_transport(comm_, device_);
}

}  // namespace feplb::cuda
