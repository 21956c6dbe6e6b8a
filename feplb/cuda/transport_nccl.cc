#include <nccl.h>

#include <map>

#include "feplb/cuda/check.h"
#include "feplb/cuda/transport.h"

#define FEPLB_NCCL_CHECK(call)                                                                   \
  do {                                                                                           \
    const ncclResult_t feplb_nr_ = (call);                                                       \
    if (feplb_nr_ != ncclSuccess)                                                                \
      ::feplb::fail_internal(__FILE__, __LINE__,                                                 \
                             fmt::format("{}: NCCL error {} ({})", #call, static_cast<int>(feplb_nr_), \
                                         ncclGetErrorString(feplb_nr_)));                        \
  } while (0)

namespace feplb::cuda {
namespace {

// One rank of a caller-owned NCCL communicator. All-to-all-v is one NCCL group of ncclSend and
// ncclRecv calls (one per chunk, matched in order per peer). Peer copies: only to itself for now;
// CUDA IPC between processes comes with the multi-GPU work.
class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    FEPLB_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    FEPLB_NCCL_CHECK(ncclCommCount(comm_, &world_));
  }
  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_gather_i32(const int32_t* send, int32_t* recv, size_t count, cudaStream_t stream) override {
    FEPLB_NCCL_CHECK(ncclAllGather(send, recv, count, ncclInt32, comm_, stream));
  }

  void exchange(std::span<const Chunk> sends, std::span<const Chunk> recvs, cudaStream_t stream) override {
    FEPLB_NCCL_CHECK(ncclGroupStart());
    for (const Chunk& c : sends) {
      if (c.bytes) FEPLB_NCCL_CHECK(ncclSend(c.ptr, c.bytes, ncclUint8, c.peer, comm_, stream));
    }
    for (const Chunk& c : recvs) {
      if (c.bytes) FEPLB_NCCL_CHECK(ncclRecv(c.ptr, c.bytes, ncclUint8, c.peer, comm_, stream));
    }
    FEPLB_NCCL_CHECK(ncclGroupEnd());
  }

  void register_buffer(const std::string& name, void* ptr, size_t) override {
    FEPLB_CHECK(world_ == 1, "NCCL transport: peer buffers across {} ranks need CUDA IPC (not built yet)", world_);
    buffers_[name] = ptr;
  }
  void* peer_buffer(const std::string& name, int peer) const override {
    FEPLB_CHECK(peer == rank_, "NCCL transport: no peer copies to rank {} yet", peer);
    return buffers_.at(name);
  }
  bool supports_peer_copies() const override { return world_ == 1; }

 private:
  ncclComm_t comm_;
  int device_;
  int rank_ = 0, world_ = 1;
  std::map<std::string, void*> buffers_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(void* nccl_comm, int device) {
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(nccl_comm), device);
}

}  // namespace feplb::cuda
