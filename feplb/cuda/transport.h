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

// How a signal set (Transport::Signals) makes the signaller's earlier work on its stream visible to
// the waiter's later work. Declared once here; parse_signal_mechanism reads the names below.
enum class SignalMechanism {
  // "event": CUDA events (interprocess events between processes). The documented way to order
  // work between streams, GPUs and processes; the waiting host thread blocks, bounded, until the
  // signaller's host has recorded the event for the value. The default.
  kEvent,
  // "memop": a stream memory write into the peer's flag after a system-scope memory barrier, and
  // a stream memory wait on one's own flag. No host round trip, but between two GPUs the flag has
  // been seen to overtake the tail of a copy before it (feplb/cuda/transport/ipc_signals.h says
  // what holds).
  kStreamMemop,
  // "ce-flag": the value is written into a local word, then copied into the peer's flag by the
  // copy engine on the signaller's stream (the path the data took); the same wait as "memop".
  kCeFlag,
};
inline constexpr SignalMechanism kDefaultSignalMechanism = SignalMechanism::kEvent;
// "event", "memop", "ce-flag".
std::string_view signal_mechanism_name(SignalMechanism mechanism);
// The inverse; InputError naming the text and the choices otherwise.
SignalMechanism parse_signal_mechanism(std::string_view name);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // recv [world * count] <- every rank's send [count], in rank order. Collective.
  virtual void all_gather_i32(const int32_t* send, int32_t* recv, size_t count,
                              cudaStream_t stream) = 0;
  // All-to-all-v. The i-th send chunk to peer p lands in p's i-th recv chunk from this rank; the
  // sizes must agree. Reads and writes happen after prior work on `stream` (on every rank
  // involved) and before later work. Zero-byte chunks are allowed. Collective.
  virtual void exchange(std::span<const Chunk> sends, std::span<const Chunk> recvs,
                        cudaStream_t stream) = 0;

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
  // `mechanism` picks how (SignalMechanism); every rank passes the same one. A set is destroyed
  // only after every rank's last signal and wait on it have completed (e.g. after a barrier).
  class Signals {
   public:
    virtual ~Signals() = default;
    virtual void signal(int peer, int slot, uint32_t value, cudaStream_t stream) = 0;
    virtual void wait(int slot, uint32_t value, cudaStream_t stream) = 0;
    virtual SignalMechanism mechanism() const = 0;
  };
  virtual std::unique_ptr<Signals> make_signals(const std::string& name, int count,
                                                SignalMechanism mechanism) = 0;
  std::unique_ptr<Signals> make_signals(const std::string& name, int count) {
    return make_signals(name, count, kDefaultSignalMechanism);
  }

  // A peer this rank can no longer work with, in one line naming it ("rank 1 (pid 4242)
  // exited"; or the communicator's asynchronous error), or empty while none is known. The
  // runtime's bounded waits on peers poll it (about every millisecond), so a peer that dies in
  // the middle of a step is an Error within milliseconds, not at the timeout. Safe from any thread.
  virtual std::string peer_failure() const { return {}; }
};

// R virtual ranks in one process on the current GPU. Each rank's thread calls its endpoint's
// collectives; a rank that does not arrive within `timeout_s` makes the others throw Error. Its
// signals are CUDA events (SignalMechanism::kEvent only; another mechanism is an InputError).
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

// One rank of an NCCL communicator (which the caller keeps owning). Its signal sets are
// make_ipc_signals (feplb/cuda/transport/ipc_signals.h) over the communicator's all-gather: every
// rank of the communicator on one host. peer_failure() reports a peer process on this host that
// exited (PeerWatch, feplb/cuda/transport/peer_watch.h) and the communicator's asynchronous error
// (ncclCommGetAsyncError); after such an Error, abort the communicator and leave the process
// (streams may still wait on the dead peer's work).
std::unique_ptr<Transport> make_nccl_transport(void* nccl_comm, int device);

}  // namespace feplb::cuda
