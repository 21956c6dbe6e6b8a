// The grouped GEMMs whose sizes live in device memory (kernels/grouped_gemm.h) and the expert FFN
// batches built on them (gemm/grouped_ffn.h), against float64 host products on fresh random
// inputs. Tolerances (relative L2): one GEMM with a bf16 D 1e-2 (the result's rounding), with an
// fp32 D 1e-4; an FFN stage chain (bf16 gu, act and outputs between GEMMs) 2e-2, as the layer
// tests. Skipped without a GPU, and without one of compute capability 9.0 (the kernels are
// sm_90a's).
#include "feplb/cuda/kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "feplb/core/bf16.h"
#include "feplb/core/rng.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/gemm/grouped_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "gpu_test_util.h"

namespace feplb {
namespace {

using cuda::kernels::GroupedLayout;
using cuda::kernels::GroupedTile;
using testing::compare;

#define SKIP_WITHOUT_GROUPED_GEMMS()                                                       \
  do {                                                                                     \
    FEPLB_SKIP_WITHOUT_GPU();                                                              \
    if (!cuda::GroupedFfn::available())                                                    \
      GTEST_SKIP() << "the grouped GEMM kernels need compute capability 9.0 (H100, H200)"; \
  } while (0)

std::vector<float> random_bf16(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = round_to_bf16(static_cast<float>(rng.normal() * scale));
  return v;
}

// A device buffer of floats stored as bf16 or fp32.
struct DeviceMatrix {
  bool f32 = false;
  size_t n = 0;
  cuda::DeviceBuffer<unsigned char> mem;
  DeviceMatrix(const std::vector<float>& v, bool as_f32) : f32(as_f32), n(v.size()) {
    mem = cuda::DeviceBuffer<unsigned char>(std::max<size_t>(n, 1) * (f32 ? 4 : 2));
    upload(v);
  }
  void upload(const std::vector<float>& v) {
    if (f32) {
      FEPLB_CUDA_CHECK(cudaMemcpy(mem.get(), v.data(), n * 4, cudaMemcpyHostToDevice));
    } else {
      const auto h = testing::to_bf16(v);
      FEPLB_CUDA_CHECK(cudaMemcpy(mem.get(), h.data(), n * 2, cudaMemcpyHostToDevice));
    }
  }
  std::vector<float> download() const {
    std::vector<float> out(n);
    if (f32) {
      FEPLB_CUDA_CHECK(cudaMemcpy(out.data(), mem.get(), n * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<uint16_t> h(n);
      FEPLB_CUDA_CHECK(cudaMemcpy(h.data(), mem.get(), n * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
    }
    return out;
  }
  void* get() const { return mem.get(); }
};

// One group: D [m, n] = beta D + A B with A, B stored as `layout` says (row-major).
struct Group {
  int m, n, k;
  std::vector<float> a, b, d0;
};

std::vector<double> reference(const Group& g, GroupedLayout layout, float beta) {
  std::vector<double> d(static_cast<size_t>(g.m) * g.n);
  for (int i = 0; i < g.m; ++i) {
    for (int j = 0; j < g.n; ++j) {
      double s = beta * g.d0[static_cast<size_t>(i) * g.n + j];
      for (int l = 0; l < g.k; ++l) {
        const double a = layout == GroupedLayout::kTN ? g.a[static_cast<size_t>(l) * g.m + i]
                                                      : g.a[static_cast<size_t>(i) * g.k + l];
        const double b = layout == GroupedLayout::kNT ? g.b[static_cast<size_t>(j) * g.k + l]
                                                      : g.b[static_cast<size_t>(l) * g.n + j];
        s += a * b;
      }
      d[static_cast<size_t>(i) * g.n + j] = s;
    }
  }
  return d;
}

// The groups' operands on the device and their tables, uploaded from the host.
struct Problem {
  std::vector<DeviceMatrix> a, b, d;
  cuda::DeviceBuffer<unsigned char> tables_mem;
  cuda::kernels::GroupedTables tables{};

  Problem(const std::vector<Group>& groups, GroupedLayout layout, bool d_f32) {
    const int G = static_cast<int>(groups.size());
    tables_mem = cuda::DeviceBuffer<unsigned char>(cuda::kernels::grouped_tables_bytes(G));
    tables = cuda::kernels::carve_grouped_tables(tables_mem.get(), G);
    for (const Group& g : groups) {
      a.emplace_back(g.a, false);
      b.emplace_back(g.b, false);
      d.emplace_back(g.d0, d_f32);
    }
    std::vector<int32_t> sizes;
    std::vector<const void*> pa, pb;
    std::vector<void*> pd;
    std::vector<int64_t> lda, ldb, ldd;
    for (int i = 0; i < G; ++i) {
      const Group& g = groups[static_cast<size_t>(i)];
      sizes.insert(sizes.end(), {g.m, g.n, g.k});
      pa.push_back(a[static_cast<size_t>(i)].get());
      pb.push_back(b[static_cast<size_t>(i)].get());
      pd.push_back(d[static_cast<size_t>(i)].get());
      lda.push_back(layout == GroupedLayout::kTN ? g.m : g.k);
      ldb.push_back(layout == GroupedLayout::kNT ? g.k : g.n);
      ldd.push_back(g.n);
    }
    const auto put = [](void* dst, const auto& v) {
      FEPLB_CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice));
    };
    put(tables.sizes, sizes);
    put(tables.a, pa);
    put(tables.b, pb);
    put(tables.d, pd);
    put(tables.lda, lda);
    put(tables.ldb, ldb);
    put(tables.ldd, ldd);
  }
};

int sm_count() {
  int device = 0, sms = 0;
  FEPLB_CUDA_CHECK(cudaGetDevice(&device));
  FEPLB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// Every layout, tile family, output type and beta against float64: groups of 0 (their D left as
// it was), 1, odd and several-tile sizes in the dimension that carries the rows (m; k for kTN,
// where a group without rows is given m = 0, as the FFN tables do).
TEST(GroupedGemm, EveryLayoutMatchesFloat64) {
  SKIP_WITHOUT_GROUPED_GEMMS();
  Rng rng(17);
  const int sms = sm_count();
  cuda::DeviceBuffer<unsigned char> ws(cuda::kernels::grouped_gemm_workspace_bytes(sms));
  cuda::Stream stream;
  struct Case {
    GroupedLayout layout;
    GroupedTile tile;
    bool f32;
    float beta;
  };
  const Case cases[] = {
      {GroupedLayout::kNN, GroupedTile::kLarge, false, 0.f},
      {GroupedLayout::kNN, GroupedTile::kSmallM, false, 0.f},
      {GroupedLayout::kNN, GroupedTile::kLarge, false, 1.f},
      {GroupedLayout::kNT, GroupedTile::kLarge, false, 0.f},
      {GroupedLayout::kNT, GroupedTile::kSmallM, false, 1.f},
      {GroupedLayout::kTN, GroupedTile::kLarge, false, 0.f},
      {GroupedLayout::kTN, GroupedTile::kLarge, false, 1.f},
      {GroupedLayout::kTN, GroupedTile::kLarge, true, 0.f},
      {GroupedLayout::kTN, GroupedTile::kLarge, true, 1.f},
  };
  const int rows[] = {0, 1, 37, 128, 300, 129, 513};
  for (const Case& c : cases) {
    std::vector<Group> groups;
    for (int r : rows) {
      Group g;
      if (c.layout == GroupedLayout::kTN) {  // weight-gradient-like: the rows are k
        g.m = r == 0 ? 0 : 136;
        g.n = 200;
        g.k = r;
      } else {
        g.m = r;
        g.n = 136;
        g.k = 200;
      }
      g.a = random_bf16(rng, static_cast<size_t>(g.m) * g.k);
      g.b = random_bf16(rng, static_cast<size_t>(g.k) * g.n);
      // Where D is a sentinel for an empty group it must stay as it was.
      g.d0 = random_bf16(rng, static_cast<size_t>(std::max(g.m, 1)) * g.n);
      groups.push_back(std::move(g));
    }
    Problem p(groups, c.layout, c.f32);
    cuda::kernels::GroupedGemmArgs args;
    args.layout = c.layout;
    args.tile = c.tile;
    args.d_f32 = c.f32;
    args.beta = c.beta;
    args.num_groups = static_cast<int>(groups.size());
    args.tables = p.tables;
    args.workspace = ws.get();
    args.sm_count = sms;
    FEPLB_CUDA_CHECK(cuda::kernels::grouped_gemm(args, stream.get()));
    cuda::sync_with_timeout(stream.get(), 30, "grouped gemm");
    for (size_t i = 0; i < groups.size(); ++i) {
      const Group& g = groups[i];
      const std::vector<float> got = p.d[i].download();
      std::string what = "layout " + std::to_string(static_cast<int>(c.layout)) + " tile " +
                         std::to_string(static_cast<int>(c.tile)) + (c.f32 ? " f32" : " bf16") +
                         " beta " + std::to_string(c.beta) + " rows " + std::to_string(rows[i]);
      if (g.m == 0) {
        const std::vector<float> before = DeviceMatrix(g.d0, c.f32).download();
        EXPECT_EQ(0, std::memcmp(got.data(), before.data(), got.size() * 4))
            << what << ": an empty group wrote its D";
        continue;
      }
      const auto e = compare(got, reference(g, c.layout, c.beta));
      EXPECT_LE(e.rel_l2, c.f32 ? 1e-4 : 1e-2) << what;
    }
  }
}

// The sizes are read on the GPU at every launch: new sizes written into the same tables (no host
// call in between, the launch parameters reused) give the new products.
TEST(GroupedGemm, SizesChangedInDeviceMemoryAreUsed) {
  SKIP_WITHOUT_GROUPED_GEMMS();
  Rng rng(23);
  const int sms = sm_count();
  cuda::DeviceBuffer<unsigned char> ws(cuda::kernels::grouped_gemm_workspace_bytes(sms));
  cuda::Stream stream;
  const int max_rows = 256, n = 128, k = 64, G = 3;
  std::vector<Group> groups;
  for (int i = 0; i < G; ++i) {
    Group g{max_rows,
            n,
            k,
            random_bf16(rng, size_t{max_rows} * k),
            random_bf16(rng, size_t{k} * n),
            std::vector<float>(size_t{max_rows} * n, 0.f)};
    groups.push_back(std::move(g));
  }
  Problem p(groups, GroupedLayout::kNN, false);
  cuda::kernels::GroupedGemmArgs args;
  args.num_groups = G;
  args.tables = p.tables;
  args.workspace = ws.get();
  args.sm_count = sms;
  for (const std::vector<int32_t>& m :
       {std::vector<int32_t>{256, 5, 0}, std::vector<int32_t>{3, 0, 200},
        std::vector<int32_t>{0, 256, 77}}) {
    for (int i = 0; i < G; ++i) p.d[static_cast<size_t>(i)].upload(groups[i].d0);  // zeros
    std::vector<int32_t> sizes;
    for (int i = 0; i < G; ++i) sizes.insert(sizes.end(), {m[i], n, k});
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(p.tables.sizes, sizes.data(), sizes.size() * 4,
                                     cudaMemcpyHostToDevice, stream.get()));
    FEPLB_CUDA_CHECK(cuda::kernels::grouped_gemm(args, stream.get()));
    cuda::sync_with_timeout(stream.get(), 30, "grouped gemm");
    for (int i = 0; i < G; ++i) {
      const std::vector<float> got = p.d[static_cast<size_t>(i)].download();
      Group rows_only = groups[i];
      rows_only.m = m[i];
      const auto ref = reference(rows_only, GroupedLayout::kNN, 0.f);
      std::vector<float> head(got.begin(), got.begin() + static_cast<int64_t>(m[i]) * n);
      if (m[i] > 0) {
        EXPECT_LE(compare(head, ref).rel_l2, 1e-2) << "group " << i << " m " << m[i];
      }
      for (size_t j = static_cast<size_t>(m[i]) * n; j < got.size(); ++j)
        ASSERT_EQ(got[j], 0.f) << "group " << i << ": rows past m " << m[i] << " written";
    }
  }
}

// --- GroupedFfn: batches of expert FFNs ---

constexpr int64_t kH = 256, kF = 128;

struct Expert {
  std::vector<float> w_gate_up, w_down;  // [H, 2F], [F, H]
};

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// One item's float64 forward and backward (the same math as ReferenceMoe, for one expert).
struct FfnReference {
  std::vector<double> gu, act, y, dx, dw_gu, dw_down;
};

FfnReference ffn_reference(const Expert& w, const std::vector<float>& x,
                           const std::vector<float>& dy, int64_t rows) {
  const int64_t H = kH, F = kF;
  FfnReference r;
  r.gu.assign(static_cast<size_t>(rows * 2 * F), 0.0);
  r.act.assign(static_cast<size_t>(rows * F), 0.0);
  r.y.assign(static_cast<size_t>(rows * H), 0.0);
  r.dx.assign(static_cast<size_t>(rows * H), 0.0);
  r.dw_gu.assign(static_cast<size_t>(H * 2 * F), 0.0);
  r.dw_down.assign(static_cast<size_t>(F * H), 0.0);
  std::vector<double> dgu(static_cast<size_t>(2 * F));
  for (int64_t t = 0; t < rows; ++t) {
    double* gu = &r.gu[static_cast<size_t>(t * 2 * F)];
    for (int64_t h = 0; h < H; ++h) {
      const double xv = x[static_cast<size_t>(t * H + h)];
      for (int64_t j = 0; j < 2 * F; ++j)
        gu[j] += xv * w.w_gate_up[static_cast<size_t>(h * 2 * F + j)];
    }
    double* act = &r.act[static_cast<size_t>(t * F)];
    for (int64_t f = 0; f < F; ++f) act[f] = silu(gu[f]) * gu[F + f];
    for (int64_t f = 0; f < F; ++f) {
      for (int64_t h = 0; h < H; ++h)
        r.y[static_cast<size_t>(t * H + h)] += act[f] * w.w_down[static_cast<size_t>(f * H + h)];
    }
    // Backward of this row.
    for (int64_t f = 0; f < F; ++f) {
      double dact = 0;
      for (int64_t h = 0; h < H; ++h) {
        const double d = dy[static_cast<size_t>(t * H + h)];
        dact += d * w.w_down[static_cast<size_t>(f * H + h)];
        r.dw_down[static_cast<size_t>(f * H + h)] += act[f] * d;
      }
      const double g = gu[f], u = gu[F + f], sg = 1.0 / (1.0 + std::exp(-g));
      dgu[static_cast<size_t>(f)] = dact * u * (sg + g * sg * (1.0 - sg));
      dgu[static_cast<size_t>(F + f)] = dact * silu(g);
    }
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int64_t j = 0; j < 2 * F; ++j) {
        s += dgu[static_cast<size_t>(j)] * w.w_gate_up[static_cast<size_t>(h * 2 * F + j)];
        r.dw_gu[static_cast<size_t>(h * 2 * F + j)] +=
            x[static_cast<size_t>(t * H + h)] * dgu[static_cast<size_t>(j)];
      }
      r.dx[static_cast<size_t>(t * H + h)] = s;
    }
  }
  return r;
}

// A batch of items on the device: each item's rows, weights and gradients, and its class.
struct FfnCase {
  int64_t rows;
  int grad_class;   // kernels::weight_grad_class
  int shares = -1;  // >= 0: writes the gradient of that earlier item (accumulate)
};

void run_ffn_batch(const std::vector<FfnCase>& cases, uint64_t seed, const std::string& what) {
  Rng rng(seed);
  const int64_t H = kH, F = kF;
  const size_t n = cases.size();
  std::vector<Expert> w(n);
  std::vector<std::vector<float>> x(n), dy(n), g_gu0(n), g_down0(n);
  std::vector<DeviceMatrix> dx_, dwgu, dwdown, dgu, dact, dy_dev, dout, dw_gu_dev, dw_down_dev;
  std::vector<cuda::kernels::FfnItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = cases[i].rows;
    w[i].w_gate_up = random_bf16(rng, static_cast<size_t>(H * 2 * F), 1.0 / std::sqrt(double(H)));
    w[i].w_down = random_bf16(rng, static_cast<size_t>(F * H), 1.0 / std::sqrt(double(F)));
    x[i] = random_bf16(rng, static_cast<size_t>(rows * H));
    dy[i] = random_bf16(rng, static_cast<size_t>(rows * H));
    const bool f32 = cases[i].grad_class >= 2, acc = cases[i].grad_class & 1;
    // Accumulated gradients start from random values; written ones from NaN.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    g_gu0[i] = acc ? random_bf16(rng, static_cast<size_t>(H * 2 * F), 0.1)
                   : std::vector<float>(static_cast<size_t>(H * 2 * F), nan);
    g_down0[i] = acc ? random_bf16(rng, static_cast<size_t>(F * H), 0.1)
                     : std::vector<float>(static_cast<size_t>(F * H), nan);
    dx_.emplace_back(x[i], false);             // x
    dwgu.emplace_back(w[i].w_gate_up, false);  // w_gate_up
    dwdown.emplace_back(w[i].w_down, false);   // w_down
    dgu.emplace_back(std::vector<float>(static_cast<size_t>(rows * 2 * F), nan), false);
    dact.emplace_back(std::vector<float>(static_cast<size_t>(rows * F), nan), false);
    dy_dev.emplace_back(dy[i], false);
    dout.emplace_back(std::vector<float>(static_cast<size_t>(rows * H), nan), false);
    dw_gu_dev.emplace_back(g_gu0[i], f32);
    dw_down_dev.emplace_back(g_down0[i], f32);
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t gi = cases[i].shares >= 0 ? static_cast<size_t>(cases[i].shares) : i;
    cuda::kernels::FfnItem& f = items[i];
    f.x = static_cast<const __nv_bfloat16*>(dx_[i].get());
    f.w_gate_up = static_cast<const __nv_bfloat16*>(dwgu[i].get());
    f.w_down = static_cast<const __nv_bfloat16*>(dwdown[i].get());
    f.gu = static_cast<__nv_bfloat16*>(dgu[i].get());
    f.act = static_cast<__nv_bfloat16*>(dact[i].get());
    f.y = static_cast<__nv_bfloat16*>(dout[i].get());
    f.dy = static_cast<const __nv_bfloat16*>(dy_dev[i].get());
    f.g_gate_up = dw_gu_dev[gi].get();
    f.g_down = dw_down_dev[gi].get();
    f.rows = static_cast<int32_t>(cases[i].rows);
    f.grad_class = static_cast<uint8_t>(cases[i].grad_class);
  }
  cuda::GroupedFfn ffn(H, F);
  cuda::Stream stream;
  const auto swiglu = [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      FEPLB_CUDA_CHECK(
          cuda::kernels::swiglu(items[i].gu, items[i].rows, F, items[i].act, stream.get()));
  };
  ffn.forward(items, swiglu, stream.get());
  cuda::sync_with_timeout(stream.get(), 30, "grouped ffn forward");
  std::vector<FfnReference> ref(n);
  for (size_t i = 0; i < n; ++i) {
    ref[i] = ffn_reference(w[i], x[i], dy[i], cases[i].rows);
    if (cases[i].rows == 0) continue;
    EXPECT_LE(compare(dout[i].download(), ref[i].y).rel_l2, 2e-2) << what << " item " << i << " y";
  }
  const auto swiglu_backward = [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      FEPLB_CUDA_CHECK(cuda::kernels::swiglu_backward(items[i].gu, items[i].act, items[i].rows, F,
                                                      items[i].gu, stream.get()));
  };
  ffn.backward(items, swiglu_backward, stream.get());
  cuda::sync_with_timeout(stream.get(), 30, "grouped ffn backward");
  // Expected gradients: each owner's start (accumulate) or 0 (write), plus every item writing it.
  std::vector<std::vector<double>> want_gu(n), want_down(n);
  for (size_t i = 0; i < n; ++i) {
    const bool acc = cases[i].grad_class & 1;
    want_gu[i].assign(g_gu0[i].size(), 0.0);
    want_down[i].assign(g_down0[i].size(), 0.0);
    if (acc) {
      for (size_t j = 0; j < want_gu[i].size(); ++j) want_gu[i][j] = g_gu0[i][j];
      for (size_t j = 0; j < want_down[i].size(); ++j) want_down[i][j] = g_down0[i][j];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t gi = cases[i].shares >= 0 ? static_cast<size_t>(cases[i].shares) : i;
    for (size_t j = 0; j < want_gu[gi].size(); ++j) want_gu[gi][j] += ref[i].dw_gu[j];
    for (size_t j = 0; j < want_down[gi].size(); ++j) want_down[gi][j] += ref[i].dw_down[j];
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string at = what + " item " + std::to_string(i) + " rows " +
                           std::to_string(cases[i].rows) + " class " +
                           std::to_string(cases[i].grad_class);
    if (cases[i].rows > 0) {
      EXPECT_LE(compare(dout[i].download(), ref[i].dx).rel_l2, 2e-2) << at << " dx";
    }
    if (cases[i].shares >= 0) continue;  // checked at the owner
    const auto gu = dw_gu_dev[i].download(), down = dw_down_dev[i].download();
    bool all_zero = true;
    for (double v : want_gu[i]) all_zero = all_zero && v == 0.0;
    if (all_zero) {  // no rows, written: zeros
      for (float v : gu) ASSERT_EQ(v, 0.f) << at << ": dW gate|up of an empty expert not zeroed";
      for (float v : down) ASSERT_EQ(v, 0.f) << at << ": dW down of an empty expert not zeroed";
      continue;
    }
    EXPECT_LE(compare(gu, want_gu[i]).rel_l2, 2e-2) << at << " dW gate|up";
    EXPECT_LE(compare(down, want_down[i]).rel_l2, 2e-2) << at << " dW down";
  }
}

// Experts of every size (0 rows, 1, one hot expert of 1000) in all four weight-gradient classes.
TEST(GroupedFfn, ForwardAndBackwardMatchFloat64InEveryGradientClass) {
  SKIP_WITHOUT_GROUPED_GEMMS();
  using cuda::kernels::weight_grad_class;
  const int bf16_write = weight_grad_class(false, false), bf16_add = weight_grad_class(false, true);
  const int f32_write = weight_grad_class(true, false), f32_add = weight_grad_class(true, true);
  run_ffn_batch({{64, f32_add},
                 {0, f32_add},
                 {1, f32_write},
                 {1000, f32_add},
                 {0, f32_write},
                 {37, bf16_write},
                 {0, bf16_write},
                 {200, bf16_add},
                 {129, f32_write}},
                31, "mixed classes");
  // A batch of small experts (the small-m tile: 128 rows or fewer on average).
  run_ffn_batch({{16, f32_add}, {100, f32_add}, {3, f32_add}, {0, f32_add}, {64, f32_add}}, 37,
                "small experts");
}

// Items writing the same gradient (slices of one expert) add up, in order, as if one at a time;
// the first one writes (beta 0) where its class says so.
TEST(GroupedFfn, SlicesOfOneExpertAddUp) {
  SKIP_WITHOUT_GROUPED_GEMMS();
  using cuda::kernels::weight_grad_class;
  run_ffn_batch({{48, weight_grad_class(true, false)},
                 {80, weight_grad_class(true, true), 0},
                 {30, weight_grad_class(true, true)},
                 {17, weight_grad_class(true, true), 0},
                 {0, weight_grad_class(true, true), 2}},
                41, "slices");
}

// More items than one launch of the tables kernel takes: chunked, same results.
TEST(GroupedFfn, BatchesLargerThanOneLaunch) {
  SKIP_WITHOUT_GROUPED_GEMMS();
  using cuda::kernels::weight_grad_class;
  std::vector<FfnCase> cases;
  for (int i = 0; i < cuda::kernels::kFfnItemsPerLaunch + 44; ++i)
    cases.push_back({(i * 7) % 23, weight_grad_class(true, i % 3 != 0)});
  run_ffn_batch(cases, 43, "300 items");
}

}  // namespace
}  // namespace feplb
