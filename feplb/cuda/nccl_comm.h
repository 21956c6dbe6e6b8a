// An NCCL communicator bootstrapped the way training jobs start: one process per GPU, ranks from
// the torchrun/mpirun environment (feplb/dist/launch.h), the unique id shared through the TCP
// rendezvous. Owns the communicator; aborts it (never a hang) when a peer fails.
#pragma once

#include <memory>

#include "feplb/cuda/transport.h"
#include "feplb/dist/launch.h"

namespace feplb::cuda {

class NcclCommunicator {
 public:
  // Selects GPU env.local_rank, shares rank 0's ncclUniqueId, and initialises the communicator
  // (NVLink multicast off: NCCL_NVLS_ENABLE=0 unless the caller set it). Throws Error on timeout.
  NcclCommunicator(const dist::LaunchEnv& env, double timeout_s = 60.0);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  void* comm() const { return comm_; }  // an ncclComm_t
  int device() const { return device_; }
  // A Transport over this communicator (valid while the communicator lives).
  std::unique_ptr<Transport> transport() const;
  // Aborts the communicator: every pending NCCL operation on it returns an error.
  void abort();

 private:
  void* comm_ = nullptr;
  int device_ = 0;
};

}  // namespace feplb::cuda
