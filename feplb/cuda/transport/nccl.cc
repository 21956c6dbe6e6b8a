#include <nccl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/transport.h"
#include "feplb/cuda/transport/ipc_signals.h"
#include "feplb/cuda/transport/peer_memory.h"
#include "feplb/cuda/transport/peer_watch.h"

#define FEPLB_NCCL_CHECK(call)                                                      \
  do {                                                                              \
    const ncclResult_t feplb_nr_ = (call);                                          \
    if (feplb_nr_ != ncclSuccess)                                                   \
      ::feplb::fail_internal(                                                       \
          __FILE__, __LINE__,                                                       \
          fmt::format("{}: NCCL error {} ({})", #call, static_cast<int>(feplb_nr_), \
                      ncclGetErrorString(feplb_nr_)));                              \
  } while (0)

namespace feplb::cuda {
namespace {

// How long a rank waits for its peers in the transport's own host-side collectives (buffer
// registration, the peer probe) before giving up with an Error.
constexpr double kSetupTimeoutS = 60.0;

// A call on a communicator: a non-blocking one (nccl_comm.cc creates them so) may answer
// ncclInProgress; then poll its state until it settles, `timeout_s` passes or `watch` reports a
// peer that exited. Blocking communicators never answer ncclInProgress, so this is a plain check
// for them.
void nccl_settle(ncclComm_t comm, ncclResult_t r, const char* what, double timeout_s,
                 const PeerWatch* watch = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (uint64_t polls = 0; r == ncclInProgress; ++polls) {
    if (watch && (polls & 255) == 255) {
      const std::string failed = watch->dead_peer();
      if (!failed.empty()) throw Error(fmt::format("{}: {}", what, failed));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(
          fmt::format("{}: NCCL still in progress after {:.0f} s (a peer never joined?); "
                      "abort the communicator",
                      what, timeout_s));
    }
    FEPLB_NCCL_CHECK(ncclCommGetAsyncError(comm, &r));
  }
  if (r != ncclSuccess) {
    throw Error(fmt::format("{}: NCCL error {} ({}): {}", what, static_cast<int>(r),
                            ncclGetErrorString(r), ncclGetLastError(comm)));
  }
}

// One rank of a caller-owned NCCL communicator. All-to-all-v is one NCCL group of ncclSend and
// ncclRecv calls (one per chunk, matched in order per peer). Peer memory: CUDA IPC (peer_memory.h),
// the export records all-gathered through the communicator. Constructing it with more than one
// rank is collective (every rank probes whether it can address every other rank's memory).
class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    FEPLB_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    FEPLB_NCCL_CHECK(ncclCommCount(comm_, &world_));
    if (world_ > 1) {
      reachable_ = all_peers_reachable(rank_, blob_gather(), &unreachable_why_);
      watch_ = PeerWatch(rank_, world_, blob_gather());
    }
  }
  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_gather_i32(const int32_t* send, int32_t* recv, size_t count,
                      cudaStream_t stream) override {
    nccl_settle(comm_, ncclAllGather(send, recv, count, ncclInt32, comm_, stream), "ncclAllGather",
                kSetupTimeoutS, &watch_);
  }

  void exchange(std::span<const Chunk> sends, std::span<const Chunk> recvs,
                cudaStream_t stream) override {
    FEPLB_NCCL_CHECK(ncclGroupStart());
    for (const Chunk& c : sends) {
      if (c.bytes) FEPLB_NCCL_CHECK(ncclSend(c.ptr, c.bytes, ncclUint8, c.peer, comm_, stream));
    }
    for (const Chunk& c : recvs) {
      if (c.bytes) FEPLB_NCCL_CHECK(ncclRecv(c.ptr, c.bytes, ncclUint8, c.peer, comm_, stream));
    }
    nccl_settle(comm_, ncclGroupEnd(), "exchange (ncclGroupEnd)", kSetupTimeoutS, &watch_);
  }

  void register_buffer(const std::string& name, void* ptr, size_t bytes) override {
    FEPLB_CHECK(!buffers_.contains(name), "register_buffer: '{}' registered twice", name);
    Registered& reg = buffers_[name];
    reg.ptr = ptr;
    // Collective only when peers are reachable (every rank knows the same answer).
    if (world_ > 1 && reachable_)
      reg.mem = std::make_unique<PeerMemory>(ptr, bytes, rank_, blob_gather());
  }
  void* peer_buffer(const std::string& name, int peer) const override {
    const auto it = buffers_.find(name);
    FEPLB_CHECK(it != buffers_.end(), "peer_buffer: '{}' was never registered", name);
    FEPLB_CHECK(peer >= 0 && peer < world_, "peer_buffer: rank {} of {}", peer, world_);
    if (peer == rank_) return it->second.ptr;
    FEPLB_CHECK(reachable_, "NCCL transport: no peer copies to rank {}: {}", peer,
                unreachable_why_);
    return it->second.mem->peer(peer);
  }
  bool supports_peer_copies() const override { return world_ == 1 || reachable_; }

  std::unique_ptr<Signals> make_signals(const std::string& name, int count,
                                        SignalMechanism mechanism) override {
    FEPLB_CHECK(count > 0, "make_signals: '{}' with {} slots", name, count);
    FEPLB_CHECK(signal_names_.insert(name).second, "make_signals: '{}' made twice", name);
    FEPLB_CHECK(world_ == 1 || reachable_, "NCCL transport: signals need peer memory: {}",
                unreachable_why_);
    return make_ipc_signals(name, count, rank_, world_, blob_gather(), mechanism, kSetupTimeoutS,
                            [this] { return peer_failure(); });
  }

  std::string peer_failure() const override {
    std::string failed = watch_.dead_peer();
    if (!failed.empty()) return failed;
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &r) == ncclSuccess && r != ncclSuccess &&
        r != ncclInProgress) {
      return fmt::format("the NCCL communicator of rank {} reports error {} ({}): {}", rank_,
                         static_cast<int>(r), ncclGetErrorString(r), ncclGetLastError(comm_));
    }
    return {};
  }

 private:
  struct Registered {
    void* ptr = nullptr;
    std::unique_ptr<PeerMemory> mem;  // null with one rank, or when peers are not reachable
  };

  // All-gather of host blobs of any size through the communicator: lengths first, then the blobs
  // padded to the longest, each through a small device buffer, synchronously, every wait bounded.
  AllGatherBlobs blob_gather() {
    return [this](const std::string& mine) {
      const size_t world = static_cast<size_t>(world_);
      DeviceBuffer<uint64_t> lens(world);
      uint64_t my_len = mine.size();
      std::vector<uint64_t> all_lens(world);
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(lens.get() + rank_, &my_len, sizeof(my_len),
                                       cudaMemcpyHostToDevice, setup_stream_.get()));
      // In-place all-gather: rank r's piece already sits at r.
      nccl_settle(
          comm_,
          ncclAllGather(lens.get() + rank_, lens.get(), 1, ncclUint64, comm_, setup_stream_.get()),
          "blob all-gather (lengths)", kSetupTimeoutS);
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(all_lens.data(), lens.get(), lens.bytes(),
                                       cudaMemcpyDeviceToHost, setup_stream_.get()));
      sync_with_timeout(setup_stream_.get(), kSetupTimeoutS,
                        "NCCL transport: blob all-gather (lengths)");
      uint64_t longest = 1;
      for (uint64_t l : all_lens) longest = std::max(longest, l);
      FEPLB_CHECK(longest <= (uint64_t{1} << 20), "blob all-gather: a {} byte blob", longest);
      std::string padded = mine;
      padded.resize(longest, '\0');
      DeviceBuffer<char> buf(world * longest);
      std::string host(world * longest, '\0');
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(buf.get() + rank_ * longest, padded.data(), longest,
                                       cudaMemcpyHostToDevice, setup_stream_.get()));
      nccl_settle(comm_,
                  ncclAllGather(buf.get() + rank_ * longest, buf.get(), longest, ncclUint8, comm_,
                                setup_stream_.get()),
                  "blob all-gather", kSetupTimeoutS);
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(host.data(), buf.get(), host.size(), cudaMemcpyDeviceToHost,
                                       setup_stream_.get()));
      sync_with_timeout(setup_stream_.get(), kSetupTimeoutS, "NCCL transport: blob all-gather");
      std::vector<std::string> blobs;
      for (size_t p = 0; p < world; ++p) blobs.push_back(host.substr(p * longest, all_lens[p]));
      return blobs;
    };
  }

  ncclComm_t comm_;
  int device_;
  int rank_ = 0, world_ = 1;
  Stream setup_stream_;  // registration and probes, synchronous
  bool reachable_ = false;
  std::string unreachable_why_;
  PeerWatch watch_;  // the peers' processes on this host
  std::map<std::string, Registered> buffers_;
  std::set<std::string> signal_names_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(void* nccl_comm, int device) {
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(nccl_comm), device);
}

}  // namespace feplb::cuda
