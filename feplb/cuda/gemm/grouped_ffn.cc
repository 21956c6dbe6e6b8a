#include "feplb/cuda/gemm/grouped_ffn.h"

#include <algorithm>
#include <unordered_set>

#include "feplb/core/error.h"
#include "feplb/cuda/base/check.h"

namespace feplb::cuda {

using kernels::FfnItem;
using kernels::GroupedLayout;
using kernels::GroupedTables;
using kernels::kFfnItemsPerLaunch;
using kernels::kWeightGradClasses;

namespace {

// Groups averaging this many rows or fewer take the small-m tile (64 x 128): torch._grouped_mm's
// rule for its own CUTLASS kernels.
constexpr double kSmallMRows = 128.0;

int current_device() {
  int device = 0;
  FEPLB_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace

bool GroupedFfn::available() { return kernels::grouped_gemm_available(current_device()); }

bool GroupedFfn::faster_than_per_expert(int64_t hidden, int64_t ffn, int64_t rows, int64_t items) {
  constexpr double kLargeItem = 2048.0 * 4096.0 * 1536.0;  // rows x hidden x ffn
  if (items <= 0) return true;
  const double mean_rows = static_cast<double>(rows) / static_cast<double>(items);
  return mean_rows * static_cast<double>(hidden) * static_cast<double>(ffn) < kLargeItem;
}

GroupedFfn::GroupedFfn(int64_t hidden, int64_t ffn)
    : hidden_(hidden), ffn_(ffn), batch_(std::make_unique<kernels::FfnBatch>()) {
  FEPLB_REQUIRE_INPUT(available(),
                      "grouped expert GEMMs need a GPU of compute capability 9.0 (H100, H200); "
                      "use the per-expert GEMMs (expert_gemm 'per_expert') on this one");
  FEPLB_REQUIRE_INPUT(hidden > 0 && ffn > 0 && hidden % 8 == 0 && ffn % 8 == 0,
                      "grouped expert GEMMs: hidden {} and ffn {} must be positive multiples of 8",
                      hidden, ffn);
  FEPLB_REQUIRE_INPUT(2 * hidden * ffn < (int64_t{1} << 31),
                      "grouped expert GEMMs: an expert of hidden {} x ffn {} is too large", hidden,
                      ffn);
  FEPLB_CUDA_CHECK(
      cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, current_device()));
  constexpr int kTableSets = 4 + 2 * kWeightGradClasses;
  const size_t one = kernels::grouped_tables_bytes(kFfnItemsPerLaunch);
  tables_mem_ = DeviceBuffer<unsigned char>(kTableSets * one);
  int next = 0;
  const auto carve = [&] {
    return kernels::carve_grouped_tables(tables_mem_.get() + one * static_cast<size_t>(next++),
                                         kFfnItemsPerLaunch);
  };
  tables_.gate_up = carve();
  tables_.down = carve();
  tables_.data_down = carve();
  tables_.data_gate_up = carve();
  for (int c = 0; c < kWeightGradClasses; ++c) {
    tables_.weight_down[c] = carve();
    tables_.weight_gate_up[c] = carve();
  }
  workspace_ = DeviceBuffer<unsigned char>(kernels::grouped_gemm_workspace_bytes(sm_count_));
  batch_->hidden = static_cast<int32_t>(hidden);
  batch_->ffn = static_cast<int32_t>(ffn);
}

double GroupedFfn::prepare(std::span<const FfnItem> items, size_t begin, size_t end, bool backward,
                           const DeviceRows* dev, cudaStream_t stream) {
  int64_t rows = 0, with_rows = 0;
  batch_->count = static_cast<int32_t>(end - begin);
  batch_->rows_dev = dev ? dev->rows + begin : nullptr;
  batch_->row0_dev = dev ? dev->row0 + begin : nullptr;
  for (size_t i = begin; i < end; ++i) {
    batch_->items[i - begin] = items[i];
    rows += items[i].rows;
    with_rows += items[i].rows > 0;
  }
  if (dev) {
    rows = dev->total;
    with_rows = static_cast<int64_t>(end - begin);
  }
  FEPLB_CUDA_CHECK(kernels::ffn_tables(*batch_, backward, tables_, stream));
  ++launches_;
  return with_rows ? static_cast<double>(rows) / static_cast<double>(with_rows) : 0.0;
}

void GroupedFfn::gemm(GroupedLayout layout, const GroupedTables& tables, int groups, bool d_f32,
                      float beta, double avg_rows, cudaStream_t stream) {
  kernels::GroupedGemmArgs a;
  a.layout = layout;
  a.tile = layout != GroupedLayout::kTN && avg_rows <= kSmallMRows ? kernels::GroupedTile::kSmallM
                                                                   : kernels::GroupedTile::kLarge;
  a.d_f32 = d_f32;
  a.beta = beta;
  a.num_groups = groups;
  a.tables = tables;
  a.workspace = workspace_.get();
  a.sm_count = sm_count_;
  FEPLB_CUDA_CHECK(kernels::grouped_gemm(a, stream));
  ++launches_;
  ++gemm_launches_;
}

void GroupedFfn::forward(std::span<const FfnItem> items, const Stage& swiglu, cudaStream_t stream) {
  for (size_t b = 0, e = 0; b < items.size(); b = e) {
    e = std::min(items.size(), b + kFfnItemsPerLaunch);
    const int groups = static_cast<int>(e - b);
    const double avg = prepare(items, b, e, false, nullptr, stream);
    gemm(GroupedLayout::kNN, tables_.gate_up, groups, false, 0.f, avg, stream);
    swiglu(b, e);
    gemm(GroupedLayout::kNN, tables_.down, groups, false, 0.f, avg, stream);
  }
}

void GroupedFfn::forward(std::span<const FfnItem> items, const DeviceRows& rows,
                         const std::function<void()>& swiglu, cudaStream_t stream) {
  FEPLB_CHECK(items.size() <= static_cast<size_t>(kFfnItemsPerLaunch),
              "grouped FFN with rows on the GPU: {} items, at most {}", items.size(),
              kFfnItemsPerLaunch);
  if (items.empty()) return;
  const int groups = static_cast<int>(items.size());
  const double avg = prepare(items, 0, items.size(), false, &rows, stream);
  gemm(GroupedLayout::kNN, tables_.gate_up, groups, false, 0.f, avg, stream);
  swiglu();
  gemm(GroupedLayout::kNN, tables_.down, groups, false, 0.f, avg, stream);
}

// The end of the round of items that starts at `b`: at most kFfnItemsPerLaunch items, none
// touching a gradient an earlier item of the round touches (they would race in one grouped GEMM,
// or a clear would wipe another item's sum). An item touches its gradient where it has rows, or
// where it has none and writes it (a clear).
size_t GroupedFfn::round_end(std::span<const FfnItem> items, size_t b) {
  seen_.clear();
  size_t e = b;
  for (; e < items.size() && e - b < static_cast<size_t>(kFfnItemsPerLaunch); ++e) {
    const bool writes = (items[e].grad_class & 1) == 0;  // weight_grad_class: even classes write
    if ((items[e].rows > 0 || writes) && !seen_.insert(items[e].g_down).second) break;
  }
  return e;
}

void GroupedFfn::backward(std::span<const FfnItem> items, const Stage& swiglu_backward,
                          cudaStream_t stream) {
  for (size_t b = 0, e = 0; b < items.size(); b = e) {
    e = round_end(items, b);
    backward_round(
        items, b, e, nullptr, [&] { swiglu_backward(b, e); }, stream);
  }
}

void GroupedFfn::backward(std::span<const FfnItem> items, const DeviceRows& rows,
                          const std::function<void()>& swiglu_backward, cudaStream_t stream) {
  FEPLB_CHECK(items.size() <= static_cast<size_t>(kFfnItemsPerLaunch),
              "grouped FFN with rows on the GPU: {} items, at most {}", items.size(),
              kFfnItemsPerLaunch);
  seen_.clear();
  for (const FfnItem& it : items)
    FEPLB_CHECK(seen_.insert(it.g_down).second,
                "grouped FFN with rows on the GPU: two items "
                "share a gradient");
  if (!items.empty()) backward_round(items, 0, items.size(), &rows, swiglu_backward, stream);
}

// With rows on the GPU (`dev`) the host does not know which items are empty: a written class
// gets its clearing kernel whenever it has items (the kernel skips those with rows).
void GroupedFfn::backward_round(std::span<const FfnItem> items, size_t b, size_t e,
                                const DeviceRows* dev, const std::function<void()>& swiglu_backward,
                                cudaStream_t stream) {
  const double avg = prepare(items, b, e, true, dev, stream);
  int in_class[kWeightGradClasses] = {}, empty[kWeightGradClasses] = {};
  for (size_t i = b; i < e; ++i) {
    FEPLB_CHECK(items[i].grad_class < kWeightGradClasses, "weight-gradient class {}",
                items[i].grad_class);
    ++in_class[items[i].grad_class];
    empty[items[i].grad_class] += dev ? 1 : items[i].rows == 0;
  }
  const auto weight_grads = [&](const GroupedTables* tables) {
    for (int c = 0; c < kWeightGradClasses; ++c) {
      if (in_class[c] == 0 || (!dev && in_class[c] == empty[c])) continue;
      // weight_grad_class: classes 2 and 3 are fp32, odd classes add (beta 1).
      gemm(GroupedLayout::kTN, tables[c], in_class[c], c >= 2, (c & 1) ? 1.f : 0.f, avg, stream);
    }
  };
  for (int c = 0; c < kWeightGradClasses; c += 2) {  // written (beta 0) classes: 0 and 2
    if (empty[c] == 0) continue;
    FEPLB_CUDA_CHECK(kernels::ffn_clear_empty_weight_grads(*batch_, c, stream));
    ++launches_;
  }
  const int groups = static_cast<int>(e - b);
  weight_grads(tables_.weight_down);  // reads act before dact overwrites it
  gemm(GroupedLayout::kNT, tables_.data_down, groups, false, 0.f, avg, stream);
  swiglu_backward();
  weight_grads(tables_.weight_gate_up);
  gemm(GroupedLayout::kNT, tables_.data_gate_up, groups, false, 0.f, avg, stream);
}

}  // namespace feplb::cuda
