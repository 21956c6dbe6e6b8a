#include "bench/harness/expert_bench.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "bench/harness/kernels/kernels.h"
#include "feplb/core/stats.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda {

ExpertBench::ExpertBench(const ExpertShape& shape, int64_t max_rows, int num_weight_sets,
                         int max_streams)
    : shape_(shape), max_rows_(max_rows), sets_(num_weight_sets) {
  const int64_t H = shape.hidden, F = shape.ffn;
  w_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(sets_ * expert_weight_elems(H, F)));
  x_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows * H));
  gu_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows * 2 * F));
  act_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows * F));
  y_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows * H));
  for (int i = 0; i < max_streams; ++i) {
    streams_.emplace_back();
    joins_.emplace_back();
    gemm_.push_back(std::make_unique<GemmEngine>());
  }
  const cudaStream_t s = streams_[0].get();
  // Weights ~ U(-1,1)/sqrt(fan-in), activations ~ U(-1,1): random, never zeros.
  FEPLB_CUDA_CHECK(kernels::fill_random(w_.get(), w_.size(), 1, 1.0f / 64, s));
  FEPLB_CUDA_CHECK(kernels::fill_random(x_.get(), x_.size(), 2, 1.0f, s));
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s));
}

void ExpertBench::grow(int64_t rows) {
  if (rows <= max_rows_) return;
  // The grouped GEMMs lay a call's experts one after another (the per-expert loop reuses rows):
  // room for all of them, random inputs again, the backward's buffers made again on first use.
  const int64_t H = shape_.hidden, F = shape_.ffn;
  const cudaStream_t s = streams_[0].get();
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s));
  max_rows_ = rows;
  x_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(rows * H));
  gu_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(rows * 2 * F));
  act_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(rows * F));
  y_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(rows * H));
  dy_ = DeviceBuffer<__nv_bfloat16>();
  FEPLB_CUDA_CHECK(kernels::fill_random(x_.get(), x_.size(), 2, 1.0f, s));
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s));
}

void ExpertBench::ensure_backward_buffers() {
  if (dy_.size()) return;
  const int64_t H = shape_.hidden, F = shape_.ffn;
  dy_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows_ * H));
  dx_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows_ * H));
  dgu_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows_ * 2 * F));
  dact_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(max_rows_ * F));
  grad_w_ = DeviceBuffer<float>(static_cast<size_t>(sets_ * expert_weight_elems(H, F)));
  const cudaStream_t s = streams_[0].get();
  FEPLB_CUDA_CHECK(kernels::fill_random(dy_.get(), dy_.size(), 3, 1.0f / 64, s));
  FEPLB_CUDA_CHECK(cudaMemsetAsync(grad_w_.get(), 0, grad_w_.bytes(), s));
  // Saved activations of a real forward over the whole buffer.
  const std::vector<int64_t> all(1, max_rows_);
  enqueue(all, 1, Pass::kForward);
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s));
}

void ExpertBench::enqueue_grouped(std::span<const int64_t> rows, Pass pass) {
  const int64_t H = shape_.hidden, F = shape_.ffn, we = expert_weight_elems(H, F);
  if (!grouped_) grouped_ = std::make_unique<GroupedFfn>(H, F);
  items_.clear();
  int64_t off = 0;
  int n = 0;
  for (int64_t r : rows) {
    if (r <= 0) continue;
    FEPLB_CHECK(off + r <= max_rows_, "expert bench: {} rows exceed its {} rows", off + r,
                max_rows_);
    const __nv_bfloat16* w = w_.get() + (n % sets_) * we;
    kernels::FfnItem f{};
    f.x = x_.get() + off * H;
    f.w_gate_up = w;
    f.w_down = w + 2 * H * F;
    f.gu = gu_.get() + off * 2 * F;
    f.act = act_.get() + off * F;
    f.rows = static_cast<int32_t>(r);
    if (pass == Pass::kForward) {
      f.y = y_.get() + off * H;
    } else {
      float* g = grad_w_.get() + (n % sets_) * we;
      f.y = dx_.get() + off * H;
      f.dy = dy_.get() + off * H;
      f.g_gate_up = g;
      f.g_down = g + 2 * H * F;
      f.grad_class = static_cast<uint8_t>(kernels::weight_grad_class(true, true));
    }
    items_.push_back(f);
    off += r;
    ++n;
  }
  const cudaStream_t s = streams_[0].get();
  // The experts' rows are adjacent: one SwiGLU kernel over the items of each chunk.
  const auto swiglu = [&](size_t b, size_t e) {
    int64_t n_rows = 0;
    for (size_t i = b; i < e; ++i) n_rows += items_[i].rows;
    if (n_rows == 0) return;
    FEPLB_CUDA_CHECK(
        pass == Pass::kForward
            ? kernels::swiglu(items_[b].gu, n_rows, F, items_[b].act, s)
            : kernels::swiglu_backward(items_[b].gu, items_[b].act, n_rows, F, items_[b].gu, s));
  };
  if (pass == Pass::kForward)
    grouped_->forward(items_, swiglu, s);
  else
    grouped_->backward(items_, swiglu, s);
}

void ExpertBench::enqueue(std::span<const int64_t> rows, int streams, Pass pass, Gemms gemms) {
  const int64_t H = shape_.hidden, F = shape_.ffn, we = expert_weight_elems(H, F);
  if (gemms == Gemms::kAuto) {
    int64_t total = 0, items = 0;
    for (int64_t r : rows) {
      total += std::max<int64_t>(r, 0);
      items += r > 0;
    }
    gemms = GroupedFfn::available() && GroupedFfn::faster_than_per_expert(H, F, total, items)
                ? Gemms::kGrouped
                : Gemms::kPerExpert;
  }
  if (gemms == Gemms::kGrouped) {
    int64_t total = 0;
    for (int64_t r : rows) total += std::max<int64_t>(r, 0);
    grow(total);
  }
  if (pass == Pass::kBackward) ensure_backward_buffers();
  if (gemms == Gemms::kGrouped) {
    enqueue_grouped(rows, pass);
    return;
  }
  const cudaStream_t s0 = streams_[0].get();
  for (int i = 1; i < streams; ++i) {  // fork
    FEPLB_CUDA_CHECK(cudaEventRecord(joins_[0].get(), s0));
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(streams_[i].get(), joins_[0].get(), 0));
  }
  int64_t off = 0;
  int n = 0;
  for (int64_t r : rows) {
    if (r <= 0) continue;
    FEPLB_CHECK(r <= max_rows_, "expert bench: {} rows exceed its {} rows", r, max_rows_);
    if (off + r > max_rows_) off = 0;  // reuse the activation buffers (timing only)
    const cudaStream_t s = streams_[n % streams].get();
    const __nv_bfloat16* w = w_.get() + (n % sets_) * we;
    if (pass == Pass::kForward) {
      expert_ffn(*gemm_[n % streams], s, x_.get() + off * H, r, w, w + 2 * H * F,
                 gu_.get() + off * 2 * F, act_.get() + off * F, y_.get() + off * H, H, F);
    } else {
      float* g = grad_w_.get() + (n % sets_) * we;
      expert_ffn_backward(*gemm_[n % streams], s, x_.get() + off * H, r, w, w + 2 * H * F,
                          gu_.get() + off * 2 * F, act_.get() + off * F, dy_.get() + off * H, g,
                          g + 2 * H * F, /*g_f32=*/true, 1.0f, dx_.get() + off * H,
                          dgu_.get() + off * 2 * F, dact_.get() + off * F, H, F);
    }
    off += r;
    ++n;
  }
  for (int i = 1; i < streams; ++i) {  // join
    FEPLB_CUDA_CHECK(cudaEventRecord(joins_[i].get(), streams_[i].get()));
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s0, joins_[i].get(), 0));
  }
  // Exact GEMM algorithms for row counts met for the first time, as a layer in steady state has
  // them (a warm-up call pays this, after its GPU work is enqueued; timed calls find none).
  for (auto& g : gemm_) g->refine(-1);
}

double ExpertBench::run_ms(std::span<const int64_t> rows, int streams, int reps, Pass pass,
                           Gemms gemms) {
  streams = std::clamp(streams, 1, static_cast<int>(streams_.size()));
  enqueue(rows, streams, pass, gemms);  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    start_.record(streams_[0].get());
    enqueue(rows, streams, pass, gemms);
    stop_.record(streams_[0].get());
    FEPLB_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
    ms.push_back(elapsed_ms(start_, stop_));
  }
  return quantile_of(ms, 0.5);
}

double ExpertBench::run_grouped_ms(std::span<const int64_t> rows, int reps) {
  const int64_t H = shape_.hidden, F = shape_.ffn, we = expert_weight_elems(H, F);
  const cudaStream_t s = streams_[0].get();
  // Per group (one expert per group): m, n, k, lda, ldb, ldc and pointers, cuBLAS column-major.
  std::vector<cublasOperation_t> op;
  std::vector<int> m1, n1, k1, m2, n2, k2, one;
  std::vector<const void*> a1, b1, a2, b2;
  std::vector<void*> c1, c2;
  std::vector<float> alpha, beta;
  int64_t off = 0, total = 0;
  int n = 0;
  for (int64_t r : rows) {
    if (r <= 0) continue;
    const __nv_bfloat16* w = w_.get() + (n % sets_) * we;
    op.push_back(CUBLAS_OP_N);
    one.push_back(1);
    alpha.push_back(1.0f);
    beta.push_back(0.0f);
    // GEMM1: C^T [2F, r] = W_gu^T [2F, H] * X^T [H, r]; GEMM2: C^T [H, r] = W_d^T [H, F] * A^T [F,
    // r].
    m1.push_back(static_cast<int>(2 * F));
    n1.push_back(static_cast<int>(r));
    k1.push_back(static_cast<int>(H));
    a1.push_back(w);
    b1.push_back(x_.get() + off * H);
    c1.push_back(gu_.get() + off * 2 * F);
    m2.push_back(static_cast<int>(H));
    n2.push_back(static_cast<int>(r));
    k2.push_back(static_cast<int>(F));
    a2.push_back(w + 2 * H * F);
    b2.push_back(act_.get() + off * F);
    c2.push_back(y_.get() + off * H);
    off += r;
    ++n;
  }
  total = off;
  if (n == 0) return 0.0;
  FEPLB_CHECK(total <= max_rows_, "expert bench: {} rows exceed its {} rows", total, max_rows_);
  DeviceBuffer<const void*> da1(n), db1(n), da2(n), db2(n);
  DeviceBuffer<void*> dc1(n), dc2(n);
  auto up = [&](auto& dev, auto& host) {
    FEPLB_CUDA_CHECK(
        cudaMemcpy(dev.get(), host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice));
  };
  up(da1, a1);
  up(db1, b1);
  up(dc1, c1);
  up(da2, a2);
  up(db2, b2);
  up(dc2, c2);
  FEPLB_CUBLAS_CHECK(cublasSetStream(cublas_.get(), s));
  auto once = [&] {
    FEPLB_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        cublas_.get(), op.data(), op.data(), m1.data(), n1.data(), k1.data(), alpha.data(),
        da1.get(), CUDA_R_16BF, m1.data(), db1.get(), CUDA_R_16BF, k1.data(), beta.data(),
        dc1.get(), CUDA_R_16BF, m1.data(), n, one.data(), CUBLAS_COMPUTE_32F));
    FEPLB_CUDA_CHECK(kernels::swiglu(gu_.get(), total, F, act_.get(), s));
    FEPLB_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        cublas_.get(), op.data(), op.data(), m2.data(), n2.data(), k2.data(), alpha.data(),
        da2.get(), CUDA_R_16BF, m2.data(), db2.get(), CUDA_R_16BF, k2.data(), beta.data(),
        dc2.get(), CUDA_R_16BF, m2.data(), n, one.data(), CUBLAS_COMPUTE_32F));
  };
  once();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    start_.record(s);
    once();
    stop_.record(s);
    FEPLB_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
    ms.push_back(elapsed_ms(start_, stop_));
  }
  return quantile_of(ms, 0.5);
}

ExpertBench::Queued ExpertBench::run_queued(std::span<const int64_t> rows, int reps, Pass pass,
                                            Gemms gemms) {
  const cudaStream_t s = streams_[0].get();
  enqueue(rows, 1, pass, gemms);  // warm-up: exact algorithms for these row counts
  std::vector<double> gpu, host;
  for (int i = 0; i < reps; ++i) {
    // 50 ms: far longer than enqueueing a layer's GEMMs (hundreds, at microseconds each).
    FEPLB_CUDA_CHECK(cudaLaunchHostFunc(
        s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr));
    start_.record(s);
    const auto t0 = std::chrono::steady_clock::now();
    enqueue(rows, 1, pass, gemms);
    host.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    stop_.record(s);
    FEPLB_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
    gpu.push_back(elapsed_ms(start_, stop_));
  }
  return {quantile_of(gpu, 0.5), quantile_of(host, 0.5)};
}

std::vector<std::vector<int64_t>> ExpertBench::rows_per_gpu(const Plan& plan, int num_ranks) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(num_ranks));
  for (const Slice& s : plan.slices) out[s.gpu].push_back(s.rows);
  return out;
}

}  // namespace feplb::cuda
