#include "feplb/cuda/runtime/call_queue.h"

#include <cstdlib>
#include <cstring>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/transport/stream_ops.h"

namespace feplb::cuda {

bool several_hardware_queues() {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return v == nullptr || *v == '\0' || std::atoi(v) != 1;
}

CallQueue::CallQueue() : thread_(/*spin_us=*/200.0, kCapacity) {
  FEPLB_CUDA_CHECK(cudaGetDevice(&device_));
  FEPLB_CUDA_CHECK(kernels::load_all());
  const char* handoff = std::getenv("FEPLB_CALL_HANDOFF");
  if (handoff != nullptr && *handoff != '\0') {
    FEPLB_CHECK(std::strcmp(handoff, "host") == 0 || std::strcmp(handoff, "device") == 0 ||
                    std::strcmp(handoff, "memops") == 0 || std::strcmp(handoff, "event") == 0 ||
                    std::strcmp(handoff, "warm") == 0,
                "FEPLB_CALL_HANDOFF is '{}': host, device, memops, event or warm", handoff);
    device_flags_ = std::strcmp(handoff, "host") != 0;
    inputs_by_flag_ = std::strcmp(handoff, "memops") == 0;
    done_by_event_ = std::strcmp(handoff, "event") == 0;
    warm_by_event_ = std::strcmp(handoff, "warm") == 0;
  }
  *done_host_.get() = 0;
  if (device_flags_) {
    flags_dev_ = DeviceBuffer<uint32_t>(2);
    FEPLB_CUDA_CHECK(cudaMemset(flags_dev_.get(), 0, flags_dev_.bytes()));
    done_dev_ = flags_dev_.get();
    inputs_dev_ = flags_dev_.get() + 1;
  } else {
    FEPLB_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&done_dev_), done_host_.get(), 0));
  }
  for (int i = 0; i <= kCapacity; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->queue = this;
  }
}

CallQueue::~CallQueue() {
  thread_.drain();
  FEPLB_CUDA_WARN(cudaStreamSynchronize(stream_.get()));
}

// Fills the next slot once its previous call has run (room in the thread's queue: at most
// kCapacity wait, so the call kCapacity + 1 slots back has finished), then queues it.
void CallQueue::submit(cudaStream_t caller, Body body, Body poison, bool after_caller) {
  std::lock_guard<std::mutex> lock(post_mu_);
  thread_.wait_room();
  Slot& s = *slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  s.ticket = ++next_ticket_ == 0 ? ++next_ticket_ : next_ticket_;  // 0 marks host work
  s.body = std::move(body);
  s.poison = std::move(poison);
  s.after_caller = after_caller;
  s.by_event = done_by_event_ || (warm_by_event_ && s.ticket <= kWarmCalls);  // tickets from 1
  if (after_caller && inputs_by_flag_) stream_write_u32(caller, inputs_dev_, s.ticket);
  if (after_caller && !inputs_by_flag_) s.inputs.record(caller);
  thread_.post(&CallQueue::run, &s);
  if (!s.by_event) return stream_wait_u32_geq(caller, done_dev_, s.ticket);
  thread_.drain();  // the call is enqueued: its `done` event recorded
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(caller, s.done.get(), 0));
}

void CallQueue::post_host(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(post_mu_);
  thread_.wait_room();
  Slot& s = *slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  s.ticket = 0;
  s.host = std::move(fn);
  thread_.post(&CallQueue::run, &s);
}

void CallQueue::drain() const { thread_.drain(); }

void CallQueue::raise() const {
  if (!failed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(error_mu_);
  std::rethrow_exception(error_);
}

void CallQueue::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!error_) error_ = std::move(e);
  failed_.store(true, std::memory_order_release);
}

void CallQueue::run(void* slot) {
  Slot& s = *static_cast<Slot*>(slot);
  if (s.ticket != 0) return s.queue->run_call(s);
  try {
    s.host();
  } catch (...) {
    s.queue->fail(std::current_exception());
  }
  s.host = nullptr;
}

// The call after the caller's prior work; NaN outputs where it failed or an earlier call did;
// `done` written in every case (from the host only where the stream cannot take it).
void CallQueue::run_call(Slot& s) {
  const cudaStream_t q = stream_.get();
  bool ok = !failed_.load(std::memory_order_acquire);
  try {
    FEPLB_CUDA_CHECK(cudaSetDevice(device_));
    if (s.after_caller && inputs_by_flag_) stream_wait_u32_geq(q, inputs_dev_, s.ticket);
    if (s.after_caller && !inputs_by_flag_) {
      FEPLB_CUDA_CHECK(cudaStreamWaitEvent(q, s.inputs.get(), 0));
    }
    if (ok) s.body(q);
  } catch (...) {
    fail(std::current_exception());
    ok = false;
  }
  if (!ok && s.poison) {
    try {
      s.poison(q);
    } catch (...) {  // the error stored above says what went wrong first
    }
  }
  try {
    stream_write_u32(q, done_dev_, s.ticket);
    if (s.by_event) s.done.record(q);
  } catch (...) {
    fail(std::current_exception());
    write_done_from_host(s.ticket);
  }
  s.body = nullptr;  // the call's captures go on this thread (a micro-batch handle among them)
  s.poison = nullptr;
}

// `done` = ticket without the queue's stream (which could not take the write): S never waits
// forever on a call that failed.
void CallQueue::write_done_from_host(uint32_t ticket) {
  if (!device_flags_) {
    std::atomic_ref<uint32_t>(*done_host_.get()).store(ticket, std::memory_order_release);
    return;
  }
  *done_host_.get() = ticket;
  cudaStream_t side = nullptr;
  if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) return;
  FEPLB_CUDA_WARN(
      cudaMemcpyAsync(done_dev_, done_host_.get(), sizeof(uint32_t), cudaMemcpyHostToDevice, side));
  FEPLB_CUDA_WARN(cudaStreamSynchronize(side));
  FEPLB_CUDA_WARN(cudaStreamDestroy(side));
}

}  // namespace feplb::cuda
