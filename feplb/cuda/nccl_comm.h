// NcclCommunicator: the NCCL communicator a rank's Transport runs over, obtained without owning
// the launcher's resources. Three ways in, pick the one the job already has:
//   borrow(comm)                      a communicator the caller made and keeps owning (a
//                                     framework's process group's); never destroyed, never aborted
//                                     by feplb;
//   NcclCommunicator(rank, world, device, all_gather)
//                                     rank 0 makes the ncclUniqueId and the caller's all-gather
//                                     (a framework's process group) shares it; owned;
//   NcclCommunicator(launch_env)      ranks from the torchrun/mpirun environment and the id shared
//                                     through feplb's TCP rendezvous on FEPLB_RENDEZVOUS_PORT
//                                     (default MASTER_PORT + 1; scripts/gpu-dist); owned.
// An owned communicator is initialised non-blocking and aborted (never a hang) when a peer does
// not join within the timeout. feplb sets no environment variable: NCCL's (NCCL_NVLS_ENABLE, ...)
// are the launcher's to set.
//
// Public header: no NCCL header (ncclComm_t is `ncclComm*`, declared below).
#pragma once

#include <cstddef>
#include <memory>

#include "feplb/cuda/transport.h"
#include "feplb/dist/launch.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace feplb::cuda {

class NcclCommunicator {
 public:
  // Borrows `comm` (the caller keeps owning it and destroys it after this object and every
  // transport and runtime made from it). Device, rank and size come from the communicator.
  // InputError for a null communicator.
  static NcclCommunicator borrow(ncclComm* comm);

  // Collective over `world_size` ranks: selects `device`, rank 0 makes the ncclUniqueId,
  // `all_gather` shares it (dist::share_from_rank0: its entries are checked), then a non-blocking
  // ncclCommInitRankConfig that is aborted after `timeout_s`. Throws Error on timeout or failure.
  NcclCommunicator(int rank, int world_size, int device, const dist::AllGatherBlobs& all_gather,
                   double timeout_s = 60.0);
  // The same with the launch environment's ranks, GPU env.local_rank and the TCP rendezvous.
  explicit NcclCommunicator(const dist::LaunchEnv& env, double timeout_s = 60.0);
  // The same with an ncclUniqueId the caller already shared: `id` holds its kUniqueIdBytes bytes
  // (ncclGetUniqueId's on one rank). Owned.
  static constexpr size_t kUniqueIdBytes = 128;
  static NcclCommunicator from_unique_id(const char* id, int rank, int world_size, int device,
                                         double timeout_s = 60.0);

  // Destroys an owned communicator; leaves a borrowed one alone.
  ~NcclCommunicator();
  NcclCommunicator(NcclCommunicator&& other) noexcept;
  NcclCommunicator& operator=(NcclCommunicator&& other) noexcept;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  void* comm() const { return comm_; }  // an ncclComm_t
  int device() const { return device_; }
  bool owned() const { return owned_; }
  // Gives the communicator (an ncclComm_t) up: returns it and forgets it here, never destroyed nor
  // aborted by this object; an owned one is then the caller's to destroy.
  void* release();
  // A Transport over this communicator (valid while the communicator lives).
  std::unique_ptr<Transport> transport() const;
  // Aborts an owned communicator: every pending NCCL operation on it returns an error. A borrowed
  // one is its owner's to abort: this only forgets it.
  void abort();

 private:
  NcclCommunicator() = default;
  void* comm_ = nullptr;
  int device_ = 0;
  bool owned_ = true;
};

}  // namespace feplb::cuda
