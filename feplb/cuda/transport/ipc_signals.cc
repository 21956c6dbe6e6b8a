#include "feplb/cuda/transport/ipc_signals.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/base/spin_wait.h"
#include "feplb/cuda/transport/stream_ops.h"

namespace feplb::cuda {

std::string_view signal_mechanism_name(SignalMechanism mechanism) {
  switch (mechanism) {
    case SignalMechanism::kEvent:
      return "event";
    case SignalMechanism::kStreamMemop:
      return "memop";
    case SignalMechanism::kCeFlag:
      return "ce-flag";
  }
  return "?";
}

SignalMechanism parse_signal_mechanism(std::string_view name) {
  for (SignalMechanism m :
       {SignalMechanism::kEvent, SignalMechanism::kStreamMemop, SignalMechanism::kCeFlag}) {
    if (name == signal_mechanism_name(m)) return m;
  }
  throw InputError(fmt::format("unknown signal mechanism '{}' (event, memop, ce-flag)", name));
}

namespace {

static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory counters need lock-free atomics");

template <size_t N>
void put(std::array<char, N>& dst, std::string_view s) {
  const size_t n = std::min(s.size(), N - 1);  // truncated: names and messages only
  std::memcpy(dst.data(), s.data(), n);
  dst[n] = '\0';
}

template <size_t N>
std::string get(const std::array<char, N>& src) {
  return std::string(src.data(), strnlen(src.data(), N));
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// What every rank sends first, so that all ranks check the same facts and agree on the verdict.
struct Header {
  std::array<char, 8> magic{'F', 'E', 'P', 'L', 'B', 'S', 'G', '1'};
  int32_t rank = 0, world = 0, count = 0, ring = 0;
  int32_t mechanism = 0;
  int32_t device = 0;
  int64_t pid = 0;
  uint64_t name_hash = 0;
  std::array<char, 64> name{};  // for messages (truncated)
  std::array<char, 256> host{};
  std::array<char, 128> shm_name{};  // rank 0 of an event set of several ranks: its counters
  std::array<char, 512> error{};     // non-empty: this rank's own setup failed, and why
};

Header header_here(const std::string& name, int rank, int world, int count,
                   SignalMechanism mechanism) {
  Header h;
  h.rank = rank;
  h.world = world;
  h.count = count;
  h.ring = mechanism == SignalMechanism::kEvent ? kSignalRing : 0;
  h.mechanism = static_cast<int32_t>(mechanism);
  h.name_hash = fnv1a(name);
  put(h.name, name);
  h.pid = static_cast<int64_t>(::getpid());
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) == 0) put(h.host, host.data());
  h.device = -1;  // set by the caller's setup (a CUDA call, which may fail)
  return h;
}

std::string encode(const Header& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

// Every rank's header from the front of its blob, and the first problem any of them shows (a
// rank's own failure, a rank that disagrees with rank 0, a rank on another host), or "". Every
// rank sees the same blobs, so every rank finds the same problem.
std::string read_headers(const std::vector<std::string>& blobs, int world,
                         std::vector<Header>* out) {
  if (static_cast<int>(blobs.size()) != world)
    return fmt::format("{} ranks answered, expected {}", blobs.size(), world);
  out->assign(blobs.size(), Header{});
  for (size_t p = 0; p < blobs.size(); ++p) {
    if (blobs[p].size() < sizeof(Header))
      return fmt::format("rank {} sent {} bytes (another binary?)", p, blobs[p].size());
    std::memcpy(&(*out)[p], blobs[p].data(), sizeof(Header));
    if ((*out)[p].magic != Header{}.magic)
      return fmt::format("rank {} sent no signal-set header (another binary?)", p);
  }
  for (size_t p = 0; p < blobs.size(); ++p) {
    if (!get((*out)[p].error).empty()) return fmt::format("rank {}: {}", p, get((*out)[p].error));
  }
  const Header& r0 = (*out)[0];
  for (size_t p = 0; p < blobs.size(); ++p) {
    const Header& h = (*out)[p];
    if (h.rank != static_cast<int32_t>(p))
      return fmt::format("blob {} comes from rank {}", p, h.rank);
    if (h.name_hash != r0.name_hash) {
      return fmt::format("rank {} makes set '{}' while rank 0 makes '{}'", p, get(h.name),
                         get(r0.name));
    }
    if (h.world != r0.world || h.count != r0.count || h.ring != r0.ring ||
        h.mechanism != r0.mechanism) {
      return fmt::format(
          "rank {} asks for {} ranks x {} slots, mechanism {}; rank 0 for {} x {}, mechanism {}", p,
          h.world, h.count, signal_mechanism_name(static_cast<SignalMechanism>(h.mechanism)),
          r0.world, r0.count, signal_mechanism_name(static_cast<SignalMechanism>(r0.mechanism)));
    }
    if (get(h.host) != get(r0.host)) {
      return fmt::format(
          "rank {} is on host {}, rank 0 on {}: all ranks of a signal set must be on one host", p,
          get(h.host), get(r0.host));
    }
  }
  return {};
}

// Every rank's verdict on a step ("" = fine). Throws the first failure on every rank alike.
void agree(const AllGatherBlobs& all_gather, const std::string& set, const std::string& mine) {
  const std::vector<std::string> verdicts = all_gather(mine);
  for (size_t p = 0; p < verdicts.size(); ++p) {
    if (!verdicts[p].empty())
      throw Error(fmt::format("signal set '{}': rank {}: {}", set, p, verdicts[p]));
  }
}

// uint32 counters every rank of a set maps: POSIX shared memory, created and zeroed by rank 0,
// opened by the others, unlinked by rank 0 once everyone mapped it (or when it is destroyed). With
// one rank, plain process memory.
class SharedCounters {
 public:
  SharedCounters() = default;
  SharedCounters(const SharedCounters&) = delete;
  SharedCounters& operator=(const SharedCounters&) = delete;
  ~SharedCounters() {
    if (owner_ && !unlinked_) unlink();
    if (map_) ::munmap(map_, bytes_);
  }

  // Process memory for one rank.
  void make_private(size_t n) {
    local_ = std::make_unique<std::atomic<uint32_t>[]>(n);
    for (size_t i = 0; i < n; ++i) local_[i].store(0, std::memory_order_relaxed);
    counters_ = local_.get();
    n_ = n;
  }

  // A fresh segment of n zeroed counters, named uniquely on this host.
  void create(size_t n) {
    static std::atomic<uint64_t> sequence{0};
    std::random_device rd;
    const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    name_ = fmt::format("/feplb-signals-{}-{}-{:016x}", ::getpid(), sequence.fetch_add(1), nonce);
    const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw Error(fmt::format("shm_open({}, create): {}", name_, std::strerror(errno)));
    owner_ = true;
    bytes_ = segment_bytes(n);
    if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error(fmt::format("ftruncate({}, {} bytes): {}", name_, bytes_, std::strerror(e)));
    }
    map(fd);
    auto* head = static_cast<SegmentHead*>(map_);
    head->magic = kMagic;
    head->count = n;
    auto* c =
        reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(map_) + sizeof(SegmentHead));
    for (size_t i = 0; i < n; ++i) new (&c[i]) std::atomic<uint32_t>(0);
    counters_ = c;
    n_ = n;
  }

  // Rank 0's segment, which must hold n counters.
  void open(const std::string& name, size_t n) {
    name_ = name;
    const int fd = ::shm_open(name_.c_str(), O_RDWR, 0);
    if (fd < 0) throw Error(fmt::format("shm_open({}): {}", name_, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error(fmt::format("fstat({}): {}", name_, std::strerror(e)));
    }
    bytes_ = segment_bytes(n);
    if (static_cast<size_t>(st.st_size) != bytes_) {
      ::close(fd);
      throw Error(
          fmt::format("shared memory {} has {} bytes, expected {}", name_, st.st_size, bytes_));
    }
    map(fd);
    const auto* head = static_cast<const SegmentHead*>(map_);
    if (head->magic != kMagic || head->count != n) {
      throw Error(fmt::format("shared memory {} does not hold {} signal counters", name_, n));
    }
    counters_ = std::launder(
        reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(map_) + sizeof(SegmentHead)));
    n_ = n;
  }

  // Creator: removes the name; the mappings stay valid.
  void unlink() {
    unlinked_ = true;
    if (::shm_unlink(name_.c_str()) != 0) {
      std::fprintf(stderr, "feplb: shm_unlink(%s): %s\n", name_.c_str(), std::strerror(errno));
    }
  }

  const std::string& name() const { return name_; }
  std::atomic<uint32_t>& operator[](size_t i) const { return counters_[i]; }

 private:
  struct SegmentHead {
    uint64_t magic;
    uint64_t count;
    uint64_t pad[6];
  };
  static constexpr uint64_t kMagic = 0x46504c4253494731ull;  // "FPLBSIG1"
  static size_t segment_bytes(size_t n) {
    return sizeof(SegmentHead) + n * sizeof(std::atomic<uint32_t>);
  }

  void map(int fd) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED)
      throw Error(fmt::format("mmap({}, {} bytes): {}", name_, bytes_, std::strerror(e)));
    map_ = p;
  }

  std::string name_;
  bool owner_ = false, unlinked_ = false;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  std::unique_ptr<std::atomic<uint32_t>[]> local_;
  std::atomic<uint32_t>* counters_ = nullptr;
  size_t n_ = 0;
};

// Events this object must destroy (created here, or opened from a peer's handle).
struct OwnedEvents {
  std::vector<cudaEvent_t> v;
  OwnedEvents() = default;
  OwnedEvents(const OwnedEvents&) = delete;
  OwnedEvents& operator=(const OwnedEvents&) = delete;
  ~OwnedEvents() {
    for (cudaEvent_t e : v) FEPLB_CUDA_WARN(cudaEventDestroy(e));
  }
};

// One event of a rank's ring, as the blob carries it: the IPC handle, and the event itself for a
// peer in the same process (which cannot open its own process's handles).
struct EventEntry {
  cudaIpcEventHandle_t handle{};
  uint64_t raw = 0;
};

// SignalMechanism::kEvent (see ipc_signals.h).
class EventSignals final : public Transport::Signals {
 public:
  EventSignals(const std::string& name, int count, int rank, int world,
               const AllGatherBlobs& all_gather, double timeout_s, PeerFailure peer_failure)
      : name_(name),
        count_(count),
        rank_(rank),
        world_(world),
        timeout_s_(timeout_s),
        peer_failure_(std::move(peer_failure)),
        last_sent_(static_cast<size_t>(world) * count, 0) {
    const size_t per_rank =
        static_cast<size_t>(world) * count * kSignalRing;  // events, [receiver][slot][k]
    const size_t counters = per_rank * world;              // [receiver][slot][signaller][k]
    Header mine = header_here(name, rank, world, count, SignalMechanism::kEvent);
    std::vector<EventEntry> entries(per_rank);
    try {
      FEPLB_CUDA_CHECK(cudaGetDevice(&mine.device));
      own_.v.reserve(per_rank);
      for (size_t i = 0; i < per_rank; ++i) {
        cudaEvent_t e = nullptr;
        FEPLB_CUDA_CHECK(
            cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
        own_.v.push_back(e);
        FEPLB_CUDA_CHECK(cudaIpcGetEventHandle(&entries[i].handle, e));
        entries[i].raw = reinterpret_cast<uintptr_t>(e);
      }
      if (world == 1) {
        counters_.make_private(counters);
      } else if (rank == 0) {
        counters_.create(counters);
        put(mine.shm_name, counters_.name());
      }
    } catch (const std::exception& e) {
      put(mine.error, e.what());
    }
    std::string blob = encode(mine);
    blob.append(reinterpret_cast<const char*>(entries.data()), entries.size() * sizeof(EventEntry));
    const std::vector<std::string> blobs =
        world == 1 ? std::vector<std::string>{blob} : all_gather(blob);
    std::vector<Header> all;
    std::string problem = read_headers(blobs, world, &all);
    for (size_t p = 0; p < blobs.size() && problem.empty(); ++p) {
      if (blobs[p].size() != sizeof(Header) + per_rank * sizeof(EventEntry)) {
        problem = fmt::format("rank {} sent {} bytes of event handles, expected {}", p,
                              blobs[p].size() - sizeof(Header), per_rank * sizeof(EventEntry));
      }
    }
    if (!problem.empty()) throw Error(fmt::format("signal set '{}': {}", name, problem));

    // Map rank 0's counters and open the events addressed to this rank; every rank's verdict is
    // shared before anyone goes on, and rank 0 unlinks the segment once all have mapped it.
    std::string verdict;
    in_.assign(static_cast<size_t>(world) * count * kSignalRing, nullptr);
    try {
      if (world > 1 && rank != 0) counters_.open(get(all[0].shm_name), counters);
      for (int p = 0; p < world; ++p) {
        const bool same_process = all[p].pid == static_cast<int64_t>(::getpid());
        for (int s = 0; s < count; ++s) {
          for (int k = 0; k < kSignalRing; ++k) {
            cudaEvent_t& e = in_[in_index(p, s, k)];
            const size_t their = own_index(rank, s, k);  // p's event for (receiver = me, s, k)
            if (p == rank) {
              e = own_.v[their];
            } else if (same_process) {
              EventEntry entry;
              std::memcpy(&entry, blobs[p].data() + sizeof(Header) + their * sizeof(EventEntry),
                          sizeof(entry));
              e = reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(entry.raw));
            } else {
              EventEntry entry;
              std::memcpy(&entry, blobs[p].data() + sizeof(Header) + their * sizeof(EventEntry),
                          sizeof(entry));
              FEPLB_CUDA_CHECK(cudaIpcOpenEventHandle(&e, entry.handle));
              opened_.v.push_back(e);
            }
          }
        }
      }
    } catch (const std::exception& e) {
      verdict = e.what();
    }
    if (world > 1) agree(all_gather, name, verdict);
    if (world > 1 && rank == 0) counters_.unlink();
  }

  void signal(int peer, int slot, uint32_t value, cudaStream_t stream) override {
    FEPLB_CHECK(peer >= 0 && peer < world_ && slot >= 0 && slot < count_,
                "signal set '{}': peer {} slot {} ({} x {})", name_, peer, slot, world_, count_);
    uint32_t& last = last_sent_[static_cast<size_t>(peer) * count_ + slot];
    FEPLB_CHECK(
        value >= last,
        "signal set '{}': rank {} signals slot {} of rank {} with {} after {} (values only grow)",
        name_, rank_, slot, peer, value, last);
    const int k = static_cast<int>(value % kSignalRing);
    FEPLB_CUDA_CHECK(cudaEventRecord(own_.v[own_index(peer, slot, k)], stream));
    counters_[counter_index(peer, slot, rank_, k)].store(value, std::memory_order_release);
    last = value;
  }

  void wait(int slot, uint32_t value, cudaStream_t stream) override {
    FEPLB_CHECK(slot >= 0 && slot < count_, "signal set '{}': wait on slot {} of {}", name_, slot,
                count_);
    if (value == 0) return;  // every slot starts there
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (uint64_t spins = 0;; ++spins) {
      // The entry recorded for the smallest value >= `value`: normally exactly `value`'s.
      int best_p = -1, best_k = 0, top_p = -1;
      uint32_t best = 0, top = 0;
      for (int p = 0; p < world_; ++p) {
        for (int k = 0; k < kSignalRing; ++k) {
          const uint32_t u =
              counters_[counter_index(rank_, slot, p, k)].load(std::memory_order_acquire);
          if (u >= value && (best_p < 0 || u < best)) {
            best_p = p;
            best_k = k;
            best = u;
          }
          if (u > top) {
            top = u;
            top_p = p;
          }
        }
      }
      if (best_p >= 0) {
        FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, in_[in_index(best_p, slot, best_k)], 0));
        return;
      }
      if ((spins & 16383) == 16383 && peer_failure_) {
        const std::string failed = peer_failure_();
        if (!failed.empty()) {
          throw Error(fmt::format("signal set '{}': rank {} waiting for slot {} to reach {}: {}",
                                  name_, rank_, slot, value, failed));
        }
      }
      if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
        throw Error(
            fmt::format("signal set '{}': rank {} waited {:.3g} s for slot {} to reach {}: {}",
                        name_, rank_, timeout_s_, slot, value,
                        top_p < 0 ? std::string("no rank has signalled it")
                                  : fmt::format("rank {} signalled it last, with {}", top_p, top)));
      }
      spin_pause(spins);
    }
  }

  SignalMechanism mechanism() const override { return SignalMechanism::kEvent; }

 private:
  size_t own_index(int receiver, int slot, int k) const {
    return (static_cast<size_t>(receiver) * count_ + slot) * kSignalRing + k;
  }
  size_t in_index(int signaller, int slot, int k) const {
    return (static_cast<size_t>(signaller) * count_ + slot) * kSignalRing + k;
  }
  size_t counter_index(int receiver, int slot, int signaller, int k) const {
    return ((static_cast<size_t>(receiver) * count_ + slot) * world_ + signaller) * kSignalRing + k;
  }

  std::string name_;
  int count_, rank_, world_;
  double timeout_s_;
  PeerFailure peer_failure_;
  std::vector<uint32_t> last_sent_;  // [receiver][slot]: the last value this rank signalled
  OwnedEvents own_;                  // [receiver][slot][k]: recorded by this rank
  OwnedEvents opened_;               // peers' events opened here
  std::vector<cudaEvent_t> in_;      // [signaller][slot][k]: what this rank waits on (not owned)
  // [receiver][slot][signaller][k]: the value each event was last recorded for.
  SharedCounters counters_;
};

// SignalMechanism::kStreamMemop and kCeFlag (see ipc_signals.h).
class FlagSignals final : public Transport::Signals {
 public:
  FlagSignals(const std::string& name, int count, int rank, int world,
              const AllGatherBlobs& all_gather, SignalMechanism mechanism, double timeout_s)
      : name_(name),
        count_(count),
        rank_(rank),
        world_(world),
        mechanism_(mechanism),
        last_sent_(static_cast<size_t>(world) * count, 0) {
    Header mine = header_here(name, rank, world, count, mechanism);
    try {
      FEPLB_CUDA_CHECK(cudaGetDevice(&mine.device));
      flags_ = DeviceBuffer<uint32_t>(static_cast<size_t>(count));
      if (mechanism == SignalMechanism::kCeFlag) {
        staging_ = DeviceBuffer<uint32_t>(static_cast<size_t>(world) * count * kSignalRing);
      }
      Stream setup;
      FEPLB_CUDA_CHECK(cudaMemsetAsync(flags_.get(), 0, flags_.bytes(), setup.get()));
      if (staging_.size())
        FEPLB_CUDA_CHECK(cudaMemsetAsync(staging_.get(), 0, staging_.bytes(), setup.get()));
      sync_with_timeout(setup.get(), timeout_s, "signal set: zeroing the flags");
      flush_ = can_flush_remote_writes(mine.device);
    } catch (const std::exception& e) {
      put(mine.error, e.what());
    }
    // Every rank's flags are zero before anyone learns where they are.
    if (world > 1) {
      std::vector<Header> all;
      const std::string problem = read_headers(all_gather(encode(mine)), world, &all);
      if (!problem.empty()) throw Error(fmt::format("signal set '{}': {}", name, problem));
      mem_ = std::make_unique<PeerMemory>(flags_.get(), flags_.bytes(), rank, all_gather);
    } else if (!get(mine.error).empty()) {
      throw Error(fmt::format("signal set '{}': {}", name, get(mine.error)));
    }
    for (int p = 0; p < world; ++p) {
      peer_flags_.push_back(p == rank ? flags_.get() : static_cast<uint32_t*>(mem_->peer(p)));
    }
  }

  void signal(int peer, int slot, uint32_t value, cudaStream_t stream) override {
    FEPLB_CHECK(peer >= 0 && peer < world_ && slot >= 0 && slot < count_,
                "signal set '{}': peer {} slot {} ({} x {})", name_, peer, slot, world_, count_);
    uint32_t& last = last_sent_[static_cast<size_t>(peer) * count_ + slot];
    FEPLB_CHECK(
        value >= last,
        "signal set '{}': rank {} signals slot {} of rank {} with {} after {} (values only grow)",
        name_, rank_, slot, peer, value, last);
    uint32_t* flag = peer_flags_[peer] + slot;
    if (mechanism_ == SignalMechanism::kStreamMemop) {
      stream_barrier_write_u32(stream, flag, value);
    } else {
      // A word per value modulo the ring: a later signal of this slot issued from another stream
      // does not overwrite the word before this copy has read it.
      uint32_t* word = staging_.get() + (static_cast<size_t>(peer) * count_ + slot) * kSignalRing +
                       value % kSignalRing;
      stream_write_u32(stream, word, value);
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(flag, word, sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream));
    }
    last = value;
  }

  void wait(int slot, uint32_t value, cudaStream_t stream) override {
    FEPLB_CHECK(slot >= 0 && slot < count_, "signal set '{}': wait on slot {} of {}", name_, slot,
                count_);
    stream_wait_u32_geq(stream, flags_.get() + slot, value, flush_);
  }

  SignalMechanism mechanism() const override { return mechanism_; }

 private:
  std::string name_;
  int count_, rank_, world_;
  SignalMechanism mechanism_;
  bool flush_ = false;
  std::vector<uint32_t> last_sent_;  // [receiver][slot]
  DeviceBuffer<uint32_t> flags_;     // [count], this rank's slots
  DeviceBuffer<uint32_t> staging_;   // kCeFlag: [receiver][slot][ring], what the copy engine sends
  std::unique_ptr<PeerMemory> mem_;  // declared after flags_: closes the peers' mappings first
  std::vector<uint32_t*> peer_flags_;  // [world], each rank's flags as addressed here
};

}  // namespace

std::unique_ptr<Transport::Signals> make_ipc_signals(const std::string& name, int count, int rank,
                                                     int world, const AllGatherBlobs& all_gather,
                                                     SignalMechanism mechanism, double timeout_s,
                                                     PeerFailure peer_failure) {
  FEPLB_CHECK(count >= 1 && world >= 1 && rank >= 0 && rank < world && timeout_s > 0,
              "signal set '{}': {} slots, rank {} of {}, timeout {} s", name, count, rank, world,
              timeout_s);
  switch (mechanism) {
    case SignalMechanism::kEvent:
      return std::make_unique<EventSignals>(name, count, rank, world, all_gather, timeout_s,
                                            std::move(peer_failure));
    case SignalMechanism::kStreamMemop:
    case SignalMechanism::kCeFlag:
      return std::make_unique<FlagSignals>(name, count, rank, world, all_gather, mechanism,
                                           timeout_s);
  }
  FEPLB_CHECK(false, "signal set '{}': mechanism {}", name, static_cast<int>(mechanism));
  return nullptr;
}

}  // namespace feplb::cuda
