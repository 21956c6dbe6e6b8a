// CUDA IPC between the processes of one node: every rank exports a device buffer, the export
// records are all-gathered by a function the caller provides (TCP rendezvous, NCCL all-gather),
// and every rank maps its peers' buffers into its own address space for copy-engine copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace feplb::cuda {

// Every rank calls it with its blob and gets every rank's blob, in rank order. Collective.
using AllGatherBlobs = std::function<std::vector<std::string>(const std::string&)>;

// Where a process's current GPU is, as other processes can recognise it.
struct PeerLocation {
  std::string host;        // gethostname()
  int64_t pid = 0;         // getpid()
  int device = 0;          // the device ordinal in that process (CUDA_VISIBLE_DEVICES applies)
  std::string pci_bus_id;  // "0000:19:00.0": the same GPU in every process
};

// This process, on its current device.
PeerLocation this_location();
// Empty when this process, on its current device, can address memory of a peer at `peer`
// (same process; or same host, GPU visible here and either this GPU or peer-accessible from it,
// with peer access enabled by this call); otherwise why not, in one line.
std::string peer_unreachable_reason(const PeerLocation& peer);

// Collective: whether every rank can address every other rank's memory (world 1: true). Two
// all-gathers, so every rank returns the same answer; `why` gets the first failure's reason.
bool all_peers_reachable(int rank, const AllGatherBlobs& all_gather, std::string* why = nullptr);

// One buffer per rank, shared. Collective: every rank constructs it with its own buffer (on its
// current device, inside one cudaMalloc allocation; the caller keeps owning it). A peer in this
// process is addressed by its raw pointer, another process's buffer through
// cudaIpcOpenMemHandle (closed by the destructor). Throws Error naming the rank and the reason
// when a peer cannot be addressed from here, or when the all-gather fails (it bounds the wait).
class PeerMemory {
 public:
  PeerMemory(void* ptr, size_t bytes, int rank, const AllGatherBlobs& all_gather);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(peers_.size()); }
  // Rank p's buffer as this process addresses it (p == rank(): the caller's own pointer).
  void* peer(int p) const;
  size_t peer_bytes(int p) const;
  const PeerLocation& location(int p) const;

 private:
  struct Peer {
    PeerLocation where;
    void* ptr = nullptr;          // peer's buffer, usable here
    void* opened_base = nullptr;  // non-null: what cudaIpcOpenMemHandle returned (to close)
    size_t bytes = 0;
  };
  int rank_ = 0;
  int device_ = 0;
  std::vector<Peer> peers_;
};

}  // namespace feplb::cuda
