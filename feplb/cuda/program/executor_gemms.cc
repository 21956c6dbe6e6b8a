// Executor's GEMM steps (program/executor.h): a batch of expert FFNs bound to pointers and run as
// grouped GEMMs (gemm/grouped_ffn.h) or one cuBLASLt GEMM per item and stage, and a one-rank call's
// FFNs over rows counted on the GPU (Op::kCountedGemm).
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/gemm/grouped_ffn.h"
#include "feplb/cuda/kernels/ffn_tables.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/program/executor.h"
#include "feplb/cuda/runtime/runtime_state.h"

namespace feplb::cuda {

// One GEMM item's operands: weights (the caller's or a guest slot's), its rows in gu/act, its
// input and output rows, and in a backward dY and where dW goes (a guest's fp32 gradient slot, or
// the caller's gradients in their dtype).
Executor::GemmOperands Executor::bind(const GemmItem& g, const Bindings& b, bool backward) const {
  const CallParts& r = rt_;
  const int64_t H = r.H, F = r.F;
  const MicroBatchState& h = *b.mb;
  const bool slot = g.w.buf == Buf::kGuestSlot;
  GemmOperands it{};
  it.w_gu = slot ? r.pool.slot(static_cast<int>(g.w.index))
                 : b.experts[static_cast<size_t>(g.w.index)].gate_up;
  it.w_down = slot ? it.w_gu + 2 * H * F : b.experts[static_cast<size_t>(g.w.index)].down;
  it.gu = (g.guest ? h.gu_guest : h.gu_home) + g.act_row * 2 * F;
  it.act = (g.guest ? h.act_guest : h.act_home) + g.act_row * F;
  it.x = rows(g.x, b);
  it.y = rows(g.y, b);
  if (!backward) return it;
  it.dy = rows(g.dy, b);
  it.g_f32 = true;
  if (g.g.buf == Buf::kGradSlot) {
    float* slot_gu = r.pool.grad_slot(static_cast<int>(g.g.index));
    it.g_gu = slot_gu;
    it.g_down = slot_gu + 2 * H * F;
  } else {
    const ExpertGrads& eg = b.grads[static_cast<size_t>(g.g.index)];
    it.g_f32 = !eg.bf16_pair();
    it.g_gu = it.g_f32 ? static_cast<void*>(eg.gate_up) : eg.gate_up_bf16;
    it.g_down = it.g_f32 ? static_cast<void*>(eg.down) : eg.down_bf16;
  }
  return it;
}

// One SwiGLU kernel (forward: act from gu; backward: dgu into gu from dact in act) per run of
// adjacent experts among the batch's items [begin, end) (list.gemms indices; items_ holds the
// step's items from `first` on).
void Executor::swiglu_runs(const StepList& list, uint32_t first, uint32_t begin, uint32_t end,
                           bool backward, cudaStream_t st) {
  const int64_t F = rt_.F;
  for (uint32_t i = begin; i < end;) {
    const GemmItem& g = list.gemms[i];
    int64_t n = g.rows;
    uint32_t j = i + 1;
    for (; j < end; ++j) {
      const GemmItem& next = list.gemms[j];
      if (next.guest != g.guest || next.act_row != g.act_row + n) break;
      n += next.rows;
    }
    const GemmOperands& it = items_[i - first];
    if (n > 0) {
      FEPLB_CUDA_CHECK(backward ? kernels::swiglu_backward(it.gu, it.act, n, F, it.gu, st)
                                : kernels::swiglu(it.gu, n, F, it.act, st));
    }
    i = j;
  }
}

// A batch's experts in GEMM stages: the first GEMM of each, then one SwiGLU (or its backward) per
// run of adjacent experts, then the second GEMM of each. The same GEMMs as one expert at a time,
// in the same order per expert, with a kernel per run instead of one per expert (launches are
// what small experts cost).
void Executor::gemms(const StepList& list, const Step& s, Bindings& b, cudaStream_t st) {
  CallParts& r = rt_;
  const int64_t H = r.H, F = r.F;
  items_.clear();
  for (uint32_t i = s.begin; i < s.end; ++i) items_.push_back(bind(list.gemms[i], b, s.backward));
  if (r.ffn.grouped && grouped_pays(list, s) && grouped_gemms(list, s, b, st)) return;
  const auto item = [&](uint32_t i) -> const GemmOperands& { return items_[i - s.begin]; };
  if (!s.backward) {
    for (uint32_t i = s.begin; i < s.end; ++i)
      ffn_gate_up(r.ffn.gemm, st, item(i).x, list.gemms[i].rows, item(i).w_gu, item(i).gu, H, F);
    swiglu_runs(list, s.begin, s.begin, s.end, false, st);
    for (uint32_t i = s.begin; i < s.end; ++i)
      ffn_down(r.ffn.gemm, st, item(i).act, list.gemms[i].rows, item(i).w_down, item(i).y, H, F);
    return;
  }
  for (uint32_t i = s.begin; i < s.end; ++i) {
    const GemmItem& g = list.gemms[i];
    const GemmOperands& it = item(i);
    ffn_backward_down(r.ffn.gemm, st, g.rows, it.w_down, it.act, it.dy, it.g_gu, it.g_down,
                      it.g_f32, g.beta, it.act, H, F);
  }
  swiglu_runs(list, s.begin, s.begin, s.end, true, st);
  for (uint32_t i = s.begin; i < s.end; ++i) {
    const GemmItem& g = list.gemms[i];
    const GemmOperands& it = item(i);
    ffn_backward_gate_up(r.ffn.gemm, st, it.x, g.rows, it.w_gu, it.gu, it.g_gu, it.g_f32, g.beta,
                         it.y, H, F);
    if (g.guest && b.guest_rows) *b.guest_rows += g.rows;
  }
}

// Whether the step's batch runs as grouped GEMMs: always with RuntimeConfig::expert_gemm kGrouped;
// with kAuto unless its items are large (GroupedFfn::faster_than_per_expert).
bool Executor::grouped_pays(const StepList& list, const Step& s) const {
  if (rt_.cfg.expert_gemm == ExpertGemm::kGrouped) return true;
  int64_t rows = 0, items = 0;
  for (uint32_t i = s.begin; i < s.end; ++i) {
    rows += list.gemms[i].rows;
    items += list.gemms[i].rows > 0;
  }
  return GroupedFfn::faster_than_per_expert(rt_.H, rt_.F, rows, items);
}

// The batch as grouped GEMMs (gemm/grouped_ffn.h): a fixed number of launches however many
// experts it has. False (nothing enqueued) where an operand is not 16-byte aligned, which the
// grouped kernels need (TMA): the per-expert GEMMs take the batch then.
bool Executor::grouped_gemms(const StepList& list, const Step& s, Bindings& b, cudaStream_t st) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  ffn_items_.clear();
  for (uint32_t i = s.begin; i < s.end; ++i) {
    const GemmItem& g = list.gemms[i];
    const GemmOperands& it = items_[i - s.begin];
    kernels::FfnItem f{};
    f.x = it.x;
    f.w_gate_up = it.w_gu;
    f.w_down = it.w_down;
    f.gu = it.gu;
    f.act = it.act;
    f.y = it.y;
    f.rows = static_cast<int32_t>(g.rows);
    if (s.backward) {
      f.dy = it.dy;
      f.g_gate_up = it.g_gu;
      f.g_down = it.g_down;
      FEPLB_CHECK(g.beta == 0.f || g.beta == 1.f, "GEMM item beta {}", g.beta);
      f.grad_class = static_cast<uint8_t>(kernels::weight_grad_class(it.g_f32, g.beta != 0.f));
    }
    const void* operands[] = {f.x,   f.w_gate_up, f.w_down,    f.dy,    f.gu,
                              f.act, f.y,         f.g_gate_up, f.g_down};
    for (const void* p : operands) {
      if (!aligned(p)) return false;
    }
    ffn_items_.push_back(f);
  }
  const auto runs = [&](size_t begin, size_t end) {
    swiglu_runs(list, s.begin, s.begin + static_cast<uint32_t>(begin),
                s.begin + static_cast<uint32_t>(end), s.backward, st);
  };
  if (s.backward) {
    rt_.ffn.grouped->backward(ffn_items_, runs, st);
    if (b.guest_rows) {
      for (uint32_t i = s.begin; i < s.end; ++i)
        if (list.gemms[i].guest) *b.guest_rows += list.gemms[i].rows;
    }
  } else {
    rt_.ffn.grouped->forward(ffn_items_, runs, st);
  }
  return true;
}

// Every local expert's FFN over the micro-batch's rows in expert order, as grouped GEMMs whose
// rows per expert the GPU reads (GroupedFfn with DeviceRows): no size is read on the host. The
// SwiGLU (backward: its derivative) runs once over all S*K rows (rows of out-of-range pairs are
// never read). A call without pairs computes nothing; written gradients are zeroed then.
void Executor::counted_gemms(const Step& s, Bindings& b, cudaStream_t st) {
  CallParts& r = rt_;
  MicroBatchState& h = *b.mb;
  const int64_t F = r.F, pairs = b.num_tokens * b.top_k;
  if (pairs == 0) {
    if (s.backward && s.overwrite)
      for (const ExpertGrads& g : b.grads) zero_grads(g, st);
    return;
  }
  ffn_items_.clear();
  for (int i = 0; i < r.experts_per_rank; ++i) {
    const ExpertParams& w = b.experts[static_cast<size_t>(i)];
    kernels::FfnItem f{};
    f.x = s.backward ? h.x_home : rows(s.a, b);
    f.w_gate_up = w.gate_up;
    f.w_down = w.down;
    f.gu = h.gu_home;
    f.act = h.act_home;
    f.y = rows(s.b, b);
    if (s.backward) {
      const ExpertGrads& g = b.grads[static_cast<size_t>(i)];
      const bool f32 = !g.bf16_pair();
      f.dy = rows(s.a, b);
      f.g_gate_up = f32 ? static_cast<void*>(g.gate_up) : g.gate_up_bf16;
      f.g_down = f32 ? static_cast<void*>(g.down) : g.down_bf16;
      f.grad_class = static_cast<uint8_t>(kernels::weight_grad_class(f32, !s.overwrite));
    }
    ffn_items_.push_back(f);
  }
  const GroupedFfn::DeviceRows dev{h.expert_rows, h.expert_row0, pairs};
  if (s.backward) {
    r.ffn.grouped->backward(
        ffn_items_, dev,
        [&] {
          FEPLB_CUDA_CHECK(
              kernels::swiglu_backward(h.gu_home, h.act_home, pairs, F, h.gu_home, st));
        },
        st);
  } else {
    r.ffn.grouped->forward(
        ffn_items_, dev,
        [&] { FEPLB_CUDA_CHECK(kernels::swiglu(h.gu_home, pairs, F, h.act_home, st)); }, st);
  }
}

void Executor::zero_grads(const ExpertGrads& g, cudaStream_t st) {
  const int64_t H = rt_.H, F = rt_.F;
  const bool f32 = !g.bf16_pair();
  const size_t elem = f32 ? sizeof(float) : sizeof(bf16);
  FEPLB_CUDA_CHECK(cudaMemsetAsync(f32 ? static_cast<void*>(g.gate_up) : g.gate_up_bf16, 0,
                                   static_cast<size_t>(2 * H * F) * elem, st));
  FEPLB_CUDA_CHECK(cudaMemsetAsync(f32 ? static_cast<void*>(g.down) : g.down_bf16, 0,
                                   static_cast<size_t>(H * F) * elem, st));
}

}  // namespace feplb::cuda
