#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/base/spin_wait.h"
#include "feplb/cuda/transport.h"

namespace feplb::cuda {

// What the ranks share: a reusable barrier, each rank's posted recv chunks and events, buffers.
struct InProcessGroup::State {
  int world = 0;
  double timeout_s = 60.0;
  std::mutex mu;
  std::atomic<int> arrived{0};
  std::atomic<uint64_t> generation{0};
  std::vector<std::vector<Chunk>> recvs;  // [rank] recv chunks posted for the current exchange
  std::vector<cudaEvent_t> ready, done;   // [rank]
  std::map<std::string, std::vector<void*>> buffers;
  // Signal sets by name: [rank * count + slot], each an event pair (by value parity) and the
  // value each event was last recorded for.
  struct SignalSlot {
    cudaEvent_t ev[2] = {nullptr, nullptr};
    std::atomic<uint32_t> recorded[2] = {0, 0};
  };
  std::map<std::string, std::unique_ptr<SignalSlot[]>> signals;
  std::vector<cudaEvent_t> all_signal_events;

  // A spinning barrier (the ranks' threads arrive within microseconds of each other; a sleeping
  // thread would wait for a free core to be woken). The last to arrive resets the count, then
  // opens the barrier.
  void barrier(int rank, const char* where) {
    const uint64_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == world) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_release);
      return;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (uint64_t spins = 0; generation.load(std::memory_order_acquire) == gen; ++spins) {
      if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
        throw Error(
            fmt::format("in-process transport: rank {} waited {:.0f} s at {} for a peer that never "
                        "arrived",
                        rank, timeout_s, where));
      }
      spin_pause(spins);
    }
  }
};

namespace {

// Signals between virtual ranks: CUDA events, so the GPU's scheduler sees every dependency
// (stream memory waits between streams of one GPU are invisible to it and can deadlock it when
// it serialises the waiter ahead of the writer: cuStreamWaitValue32's documented caveat). The
// waiting thread blocks (bounded) until the signalling thread has recorded the event for the
// value; each slot alternates two events so a record for value v+1 never replaces the one a
// waiter of v still needs.
class InProcessSignals final : public Transport::Signals {
 public:
  InProcessSignals(InProcessGroup::State* st, InProcessGroup::State::SignalSlot* slots, int rank,
                   int count)
      : st_(st), slots_(slots), rank_(rank), count_(count) {}

  void signal(int peer, int slot, uint32_t value, cudaStream_t stream) override {
    FEPLB_CHECK(peer >= 0 && peer < st_->world && slot >= 0 && slot < count_,
                "signal to rank {} slot {}", peer, slot);
    auto& s = slots_[peer * count_ + slot];
    FEPLB_CUDA_CHECK(cudaEventRecord(s.ev[value & 1], stream));
    s.recorded[value & 1].store(value, std::memory_order_release);
  }

  void wait(int slot, uint32_t value, cudaStream_t stream) override {
    FEPLB_CHECK(slot >= 0 && slot < count_, "wait on slot {}", slot);
    auto& s = slots_[rank_ * count_ + slot];
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(st_->timeout_s);
    for (uint64_t spins = 0; s.recorded[value & 1].load(std::memory_order_acquire) < value;
         ++spins) {
      if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
        throw Error(
            fmt::format("in-process transport: rank {} waited {:.0f} s for signal {} to reach {}",
                        rank_, st_->timeout_s, slot, value));
      }
      spin_pause(spins);
    }
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, s.ev[value & 1], 0));
  }

  SignalMechanism mechanism() const override { return SignalMechanism::kEvent; }

 private:
  InProcessGroup::State* st_;
  InProcessGroup::State::SignalSlot* slots_;
  int rank_, count_;
};

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(InProcessGroup::State* st, int rank) : st_(st), rank_(rank) {}
  std::string_view name() const override { return "in-process"; }
  int rank() const override { return rank_; }
  int world_size() const override { return st_->world; }

  void all_gather_i32(const int32_t* send, int32_t* recv, size_t count,
                      cudaStream_t stream) override {
    std::vector<Chunk> sends, recvs;
    for (int p = 0; p < st_->world; ++p) {
      sends.push_back({p, const_cast<int32_t*>(send), count * sizeof(int32_t)});
      recvs.push_back({p, recv + static_cast<size_t>(p) * count, count * sizeof(int32_t)});
    }
    exchange(sends, recvs, stream);
  }

  void exchange(std::span<const Chunk> sends, std::span<const Chunk> recvs,
                cudaStream_t stream) override {
    State& st = *st_;
    FEPLB_CUDA_CHECK(cudaEventRecord(st.ready[rank_], stream));  // recv buffers free from here on
    st.recvs[rank_].assign(recvs.begin(), recvs.end());
    st.barrier(rank_, "exchange (post)");
    // Match my i-th chunk to peer p with p's i-th recv chunk from me.
    std::vector<size_t> next(static_cast<size_t>(st.world), 0);
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    for (const Chunk& c : sends) {
      FEPLB_CHECK(c.peer >= 0 && c.peer < st.world, "send to peer {} of {}", c.peer, st.world);
      const std::vector<Chunk>& theirs = st.recvs[c.peer];
      size_t& i = next[c.peer];
      while (i < theirs.size() && theirs[i].peer != rank_) ++i;
      FEPLB_CHECK(i < theirs.size(), "rank {} sends more chunks to rank {} than it receives", rank_,
                  c.peer);
      FEPLB_CHECK(theirs[i].bytes == c.bytes, "rank {} -> {}: chunk of {} bytes meets a recv of {}",
                  rank_, c.peer, c.bytes, theirs[i].bytes);
      if (c.bytes) {
        dsts_.push_back(theirs[i].ptr);
        srcs_.push_back(c.ptr);
        sizes_.push_back(c.bytes);
      }
      ++i;
    }
    for (int p = 0; p < st.world; ++p)
      FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, st.ready[p], 0));
    copy_batch(stream);
    FEPLB_CUDA_CHECK(cudaEventRecord(st.done[rank_], stream));
    st.barrier(rank_, "exchange (copy)");
    for (int p = 0; p < st.world; ++p) FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, st.done[p], 0));
  }

  void register_buffer(const std::string& name, void* ptr, size_t) override {
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      auto& v = st_->buffers[name];
      v.resize(static_cast<size_t>(st_->world), nullptr);
      v[rank_] = ptr;
    }
    st_->barrier(rank_, "register_buffer");
  }

  void* peer_buffer(const std::string& name, int peer) const override {
    std::lock_guard<std::mutex> lock(st_->mu);
    auto it = st_->buffers.find(name);
    FEPLB_CHECK(it != st_->buffers.end() && it->second[peer],
                "buffer '{}' of rank {} not registered", name, peer);
    return it->second[peer];
  }

  bool supports_peer_copies() const override { return true; }

  std::unique_ptr<Signals> make_signals(const std::string& name, int count,
                                        SignalMechanism mechanism) override {
    FEPLB_CHECK(count >= 1, "signal set '{}' of {} slots", name, count);
    FEPLB_REQUIRE_INPUT(mechanism == SignalMechanism::kEvent,
                        "in-process transport: signal set '{}' asks for '{}'; virtual ranks signal "
                        "with events only (stream memory waits between streams of one GPU can "
                        "stall its scheduler)",
                        name, signal_mechanism_name(mechanism));
    State::SignalSlot* slots = nullptr;
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      auto& set = st_->signals[name];
      if (!set) {
        set = std::make_unique<State::SignalSlot[]>(static_cast<size_t>(st_->world * count));
        for (int i = 0; i < st_->world * count; ++i) {
          for (cudaEvent_t& e : set[i].ev) {
            FEPLB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            st_->all_signal_events.push_back(e);
          }
        }
      }
      slots = set.get();
    }
    st_->barrier(rank_, "make_signals");
    return std::make_unique<InProcessSignals>(st_, slots, rank_, count);
  }

 private:
  // Same-device copies in one batch call: they run on copy engines (tests/gpu/sm_free_test.cc: a
  // kernel using every SM is not slowed).
  // Merges copies that continue each other on both sides (consecutive chunks of a rank to
  // itself or to one peer are laid out back to back in both buffers: one copy instead of one per
  // expert).
  void coalesce() {
    size_t n = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (n > 0 && static_cast<char*>(dsts_[n - 1]) + sizes_[n - 1] == dsts_[i] &&
          static_cast<const char*>(srcs_[n - 1]) + sizes_[n - 1] == srcs_[i]) {
        sizes_[n - 1] += sizes_[i];
        continue;
      }
      dsts_[n] = dsts_[i];
      srcs_[n] = srcs_[i];
      sizes_[n] = sizes_[i];
      ++n;
    }
    dsts_.resize(n);
    srcs_.resize(n);
    sizes_.resize(n);
  }

  void copy_batch(cudaStream_t stream) {
    coalesce();
    if (sizes_.empty()) return;
    // The batch call refuses the legacy default stream (a framework's usual current stream):
    // there, one cudaMemcpyAsync per chunk (same-device copies on copy engines as well).
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
      for (size_t i = 0; i < sizes_.size(); ++i) {
        FEPLB_CUDA_CHECK(
            cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], cudaMemcpyDeviceToDevice, stream));
      }
      return;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    size_t attr_idx = 0;
    FEPLB_CUDA_CHECK(cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), sizes_.size(),
                                          &attr, &attr_idx, 1, stream));
  }

  using State = InProcessGroup::State;
  State* st_;
  int rank_;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace

InProcessGroup::InProcessGroup(int world_size, double timeout_s)
    : state_(std::make_unique<State>()) {
  FEPLB_REQUIRE_INPUT(world_size >= 1, "in-process group: {} ranks", world_size);
  state_->world = world_size;
  state_->timeout_s = timeout_s;
  state_->recvs.resize(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    cudaEvent_t e1, e2;
    FEPLB_CUDA_CHECK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
    FEPLB_CUDA_CHECK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
    state_->ready.push_back(e1);
    state_->done.push_back(e2);
  }
  for (int r = 0; r < world_size; ++r)
    endpoints_.push_back(std::make_unique<InProcessTransport>(state_.get(), r));
}

InProcessGroup::~InProcessGroup() {
  endpoints_.clear();
  for (cudaEvent_t e : state_->ready) FEPLB_CUDA_WARN(cudaEventDestroy(e));
  for (cudaEvent_t e : state_->done) FEPLB_CUDA_WARN(cudaEventDestroy(e));
  for (cudaEvent_t e : state_->all_signal_events) FEPLB_CUDA_WARN(cudaEventDestroy(e));
}

Transport& InProcessGroup::endpoint(int rank) { return *endpoints_.at(static_cast<size_t>(rank)); }
int InProcessGroup::world_size() const { return state_->world; }

}  // namespace feplb::cuda
