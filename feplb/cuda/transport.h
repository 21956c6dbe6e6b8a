// Transport: how the ranks of one EP group exchange data, stream-ordered. Two implementations:
// NCCL (real GPUs: grouped ncclSend/ncclRecv, ncclAllGather) and in-process (R virtual ranks on
// one GPU, one host thread each, for tests and single-GPU benchmarks). Phase-2 copies do not go
// through these calls: they are copy-engine copies into a peer's registered buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace feplb::cuda {

// One piece of an all-to-all-v: `bytes` at `ptr`, sent to or received from `peer`.
struct Chunk {
  int peer = 0;
  void* ptr = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // recv [world * count] <- every rank's send [count], in rank order. Collective.
  virtual void all_gather_i32(const int32_t* send, int32_t* recv, size_t count, cudaStream_t stream) = 0;
  // All-to-all-v. The i-th send chunk to peer p lands in p's i-th recv chunk from this rank; the
  // sizes must agree. Reads and writes happen after prior work on `stream` (on every rank
  // involved) and before later work. Zero-byte chunks are allowed. Collective.
  virtual void exchange(std::span<const Chunk> sends, std::span<const Chunk> recvs, cudaStream_t stream) = 0;

  // Peer memory for phase 2. Collective: every rank registers `name` once; afterwards
  // peer_buffer(name, p) is p's buffer as this rank's copies address it.
  virtual void register_buffer(const std::string& name, void* ptr, size_t bytes) = 0;
  virtual void* peer_buffer(const std::string& name, int peer) const = 0;
  // Whether this rank can copy into its peers' registered buffers.
  virtual bool supports_peer_copies() const = 0;

  // Phase-2 signals, SM-free. Collective: every rank creates the set `name` once, with `count`
  // slots per rank. signal(peer, slot, value, s): once prior work on `s` is done, `peer`'s slot
  // reaches `value`. wait(slot, value, s): later work on `s` waits until this rank's slot reaches
  // `value`. Values of one slot only grow; a slot is signalled by one rank at a time.
  class Signals {
   public:
    virtual ~Signals() = default;
    virtual void signal(int peer, int slot, uint32_t value, cudaStream_t stream) = 0;
    virtual void wait(int slot, uint32_t value, cudaStream_t stream) = 0;
  };
  virtual std::unique_ptr<Signals> make_signals(const std::string& name, int count) = 0;
};

// R virtual ranks in one process on the current GPU. Each rank's thread calls its endpoint's
// collectives; a rank that does not arrive within `timeout_s` makes the others throw Error.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size, double timeout_s = 60.0);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  // The endpoint of `rank` (owned by the group; valid while it lives).
  Transport& endpoint(int rank);
  int world_size() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
};

// One rank of an NCCL communicator (which the caller keeps owning).
std::unique_ptr<Transport> make_nccl_transport(void* nccl_comm, int device);

}  // namespace feplb::cuda
