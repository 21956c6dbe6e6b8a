// CallQueue: a runtime's call thread (RuntimeConfig::call_thread). The caller's thread queues a
// call and returns; the call thread runs it on the queue's own stream, in order:
//
//   caller's thread:  record inputs[i] on S;  queue call i;  S waits done >= i  (returns at once)
//   call thread:      Q waits inputs[i];  body(Q) (counts, plan, dispatch, GEMMs, combine on Q,
//                     as the caller's thread would without the queue);  Q writes done = i
//
// S is the caller's stream, Q the queue's; `done` a word written and waited on by stream memory
// operations (no SM), compared cyclically, in device memory: on an H100 its round trip took 15.6
// us per call at one rank against 28.6 us with `done` in pinned host memory, and the layer bench
// with `done` in host memory stalled twice at 4 virtual ranks (docs/gpu-results.md, "The call
// thread"). FEPLB_CALL_HANDOFF (a measurement switch, read when the queue is made): `host` puts
// `done` in pinned host memory; `memops` also orders Q after S by a device word that S writes
// instead of the event; `event` (a diagnostic: every hand-off visible to CUDA's scheduler) makes
// the caller's thread wait until the call thread has enqueued the call, then S waits on an event
// recorded after the body, so the caller's thread waits for counts and plan again; `warm` does
// that for the queue's first kWarmCalls calls only, then waits as `device` does (a diagnostic:
// the 4-rank bench stalled as often, in the step where its queues passed their 16th call;
// docs/gpu-results.md). The wait on S works whatever the order the two threads enqueue in; the
// event is recorded before the call is queued.
// A call's body that throws stores the error (every later call is skipped), its outputs and
// those of the calls skipped are written NaN (`poison`), and `done` is written all the same, so
// S never waits forever; raise() rethrows it on the caller's thread.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/host/job_thread.h"

namespace feplb::cuda {

class CallQueue {
 public:
  using Body = std::function<void(cudaStream_t)>;
  static constexpr int kCapacity = 32;        // calls queued at once; the caller waits beyond
  static constexpr uint32_t kWarmCalls = 16;  // FEPLB_CALL_HANDOFF=warm: calls by events

  // On the current device: the stream, the flag, and every kernel of feplb loaded now (a kernel
  // loaded lazily on the call thread while a caller's stream waits would never return).
  CallQueue();
  ~CallQueue();  // runs the queued calls, waits for the stream, joins
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  // Queues `body` to run on the call thread with stream() after `caller`'s work so far, and makes
  // `caller` wait for it. `poison` (may be empty) writes NaN into the call's outputs when it fails
  // or is skipped after an earlier failure. `after_caller` false: the body reads nothing `caller`
  // wrote, so stream() does not wait for it (one stream hop fewer).
  void submit(cudaStream_t caller, Body body, Body poison, bool after_caller = true);
  // Queues host work `fn` in call order (a dropped micro-batch's memory, given back after the
  // calls queued before it). Never throws an error of the calls.
  void post_host(std::function<void()> fn);
  // Waits until every call queued so far has run on the call thread (their work is enqueued).
  void drain() const;
  // The error of a queued call, rethrown on every call from then on (nothing when none failed).
  void raise() const;
  bool on_call_thread() const { return thread_.on_this_thread(); }
  cudaStream_t stream() const { return stream_.get(); }

 private:
  struct Slot {
    CallQueue* queue = nullptr;
    Event inputs;
    Event done;             // recorded after the body where S waits on it (by_event)
    bool by_event = false;  // the `event` hand-off, or `warm`'s first calls
    uint32_t ticket = 0;    // 0: host work
    bool after_caller = true;
    Body body, poison;
    std::function<void()> host;
  };
  static void run(void* slot);
  void run_call(Slot& s);
  void fail(std::exception_ptr e);

  void write_done_from_host(uint32_t ticket);

  int device_ = 0;
  Stream stream_;
  bool device_flags_ = true;     // `done` (and `inputs_`) in device memory
  bool inputs_by_flag_ = false;  // Q waits inputs_ >= ticket (S writes it) instead of the event
  bool done_by_event_ = false;   // S waits on the slot's `done` event once the call is enqueued
  bool warm_by_event_ = false;   // ... for the first kWarmCalls calls only
  PinnedBuffer<uint32_t> done_host_{1};
  DeviceBuffer<uint32_t> flags_dev_;  // [done, inputs] with device_flags_
  uint32_t* done_dev_ = nullptr;
  uint32_t* inputs_dev_ = nullptr;
  uint32_t next_ticket_ = 0;  // under post_mu_
  size_t next_slot_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;  // kCapacity + 1: a slot is refilled only once its
                                              // call has run (one may run while kCapacity wait)
  std::mutex post_mu_;  // one poster at a time (calls, and handles dropped on any thread)
  mutable std::mutex error_mu_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  JobThread thread_;  // last: joined first, before the slots and the stream go away
};

// Whether this process's GPUs have more than one hardware queue per device
// (CUDA_DEVICE_MAX_CONNECTIONS unset or above 1), which a call thread needs.
bool several_hardware_queues();

}  // namespace feplb::cuda
