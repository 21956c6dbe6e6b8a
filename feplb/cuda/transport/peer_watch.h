// PeerWatch: whether the other ranks' processes on this host are still alive, so that a bounded
// wait on a peer fails as soon as the peer is gone (killed, crashed) instead of at its timeout.
// Collective construction: every rank shares its host name, pid and process start time (field 22
// of /proc/self/stat). A peer on this host whose /proc/<pid>/stat shows that start time is
// watched; one in another PID namespace or on another host is not (nothing here can see it).
// dead_peer() reads /proc/<pid>/stat of each watched peer: no such process, a zombie, or another
// process under that pid (a different start time) means the peer exited. No CUDA, no threads;
// safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "feplb/cuda/transport/peer_memory.h"

namespace feplb::cuda {

class PeerWatch {
 public:
  PeerWatch() = default;  // watches nothing
  // Collective over `world` ranks through `all_gather` (every rank calls it once).
  PeerWatch(int rank, int world, const AllGatherBlobs& all_gather);

  // Empty while every watched peer lives; otherwise one line naming the first that does not
  // ("rank 1 (pid 4242) exited"). About 10 us per watched peer (one small /proc read).
  std::string dead_peer() const;
  // Ranks watched (peers on this host, in this PID namespace).
  int watched() const { return static_cast<int>(peers_.size()); }

 private:
  struct Peer {
    int rank = 0;
    int64_t pid = 0;
    uint64_t start = 0;
  };
  std::vector<Peer> peers_;
};

}  // namespace feplb::cuda
