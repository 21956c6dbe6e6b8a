// Executor: runs a call's step program (program/step_program.h) on the rank's streams with the
// transport, the copy engine (ce_copy.h), the GEMM engine and the named signals. The one place
// that turns named buffers into pointers (Bindings: the current micro-batch's and the caller's,
// read when each step runs), stream ids into streams, event ids into events and signal values
// into numbers; it checks every CUDA return code. Timing is its property: marks go to the
// layer's timelines, with CUDA events only when the runtime times its calls.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "feplb/cuda/kernels/ffn_tables.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/program/step_program.h"
#include "feplb/cuda/program/timeline.h"
#include "feplb/cuda/runtime/runtime_state.h"
#include "feplb/cuda/stats.h"
#include "feplb/cuda/transport.h"
#include "feplb/cuda/transport/ce_copy.h"

namespace feplb::cuda {

// What the named buffers and values of one call are bound to. Null where a call has none.
struct Bindings {
  MicroBatchState* mb = nullptr;  // x_home, x_guest, gu/act, y_send, pair_pos
  cudaStream_t stream = nullptr;  // the caller's (StreamId::kCompute)
  uint32_t call = 0;              // Value::kCall
  int64_t num_tokens = 0;
  int top_k = 1;
  const bf16* hidden = nullptr;        // forward
  const int32_t* topk_idx = nullptr;   // forward
  const float* topk_weight = nullptr;  // forward, backward
  bf16* out = nullptr;                 // forward: out; backward: grad_hidden
  const bf16* grad_out = nullptr;      // backward
  float* grad_topk_weight = nullptr;   // backward
  const bf16* caller_in = nullptr;     // Buf::kCallerIn
  bf16* caller_out = nullptr;          // Buf::kCallerOut
  std::span<const ExpertParams> experts;
  std::span<const ExpertGrads> grads;
  // Counted as the steps run (null: not counted): copy-engine copies issued, experts' weights
  // among them, guest rows of backward GEMMs.
  int64_t* copies = nullptr;
  int64_t* weight_copies = nullptr;
  int64_t* guest_rows = nullptr;
  // Host time per kind of step (null: not clocked; stats.h).
  HostTimes* host = nullptr;
  // Forward: the layer's recent planner time, us (pinned host; KernelId::kPlannerTime sends it).
  const int32_t* planner_us = nullptr;
  // The stream is being captured into a CUDA graph (a one-rank forward or backward): the events
  // it records and waits for are graph nodes that act at each replay (external), and it records
  // no GPU timing marks.
  bool captured = false;
};

// The layer's host work at a program's kHost steps, and what it reads off the marks.
class ProgramHooks {
 public:
  virtual ~ProgramHooks() = default;
  virtual void host(HostAction action, Bindings& b) = 0;
  virtual void marked(Mark mark, bool backward, Timeline::Clock::time_point t) {
    (void)mark, (void)backward, (void)t;
  }
};

class Executor {
 public:
  // `rt`: the runtime's parts a program runs with; `grads_done`: the layer's event for
  // EventId::kGradsDone; `forward`, `backward`: its timelines. `name` names the layer in messages.
  Executor(CallParts rt, const std::string& name, Event& grads_done, Timeline& forward,
           Timeline& backward);

  // Issues `list`'s steps in order. Throws what the calls throw (Error, InputError).
  void run(const StepList& list, Bindings& b, ProgramHooks& hooks);

  // Waits (bounded by the runtime's timeout, polling the peers and the scheduler's error) until
  // the other thread published `flag` for call `call`.
  void await(HostFlag flag, uint32_t call) const;

 private:
  void step(const StepList& list, const Step& s, Bindings& b, ProgramHooks& hooks);
  void kernel(const Step& s, Bindings& b, cudaStream_t stream);
  void exchange(const StepList& list, const Step& s, const Bindings& b, cudaStream_t stream);
  void gemms(const StepList& list, const Step& s, Bindings& b, cudaStream_t stream);
  bool grouped_pays(const StepList& list, const Step& s) const;
  bool grouped_gemms(const StepList& list, const Step& s, Bindings& b, cudaStream_t stream);
  void counted_gemms(const Step& s, Bindings& b, cudaStream_t stream);
  void zero_grads(const ExpertGrads& g, cudaStream_t stream);
  void swiglu_runs(const StepList& list, uint32_t first, uint32_t begin, uint32_t end,
                   bool backward, cudaStream_t stream);
  void copy_batch(const StepList& list, const Step& s, Bindings& b, cudaStream_t stream);
  void memcpys(const StepList& list, const Step& s, const Bindings& b, cudaStream_t stream);
  void wait(const Step& s, const Bindings& b, cudaStream_t stream);
  void mark(const Step& s, cudaStream_t stream, bool captured, ProgramHooks& hooks);
  cudaStream_t stream(StreamId id, const Bindings& b) const;
  cudaEvent_t event(EventId id) const;
  uint32_t value(Value v, int peer, const Bindings& b) const;
  bf16* rows(const Ref& r, const Bindings& b) const;

  CallParts rt_;
  std::string name_;
  Event& grads_done_;
  Timeline& forward_;
  Timeline& backward_;
  // One GEMM item's operands, bound (gemms()).
  struct GemmOperands {
    const bf16 *w_gu, *w_down, *x, *dy;
    bf16 *gu, *act, *y;  // y: forward out, backward dx
    void *g_gu, *g_down;
    bool g_f32;
  };
  GemmOperands bind(const GemmItem& g, const Bindings& b, bool backward) const;
  std::vector<GemmOperands> items_;
  std::vector<kernels::FfnItem> ffn_items_;  // the batch for the grouped GEMMs
  std::vector<CeCopy> batch_;
  std::vector<Chunk> sends_, recvs_;
};

}  // namespace feplb::cuda
