// feplb_call_thread_bench: what the runtime's call thread (RuntimeConfig::call_thread) changes, on
// R virtual ranks of one GPU. A step per rank: the forwards of L layers, their backwards in reverse
// order, sync_gradients; every rank starts a step together (a barrier). Per step and rank: the
// caller's host time to enqueue the step (the call thread: checking and queueing; without it, the
// calls themselves with their waits for counts and plans) and the step's wall time to its stream's
// end. The two settings interleave step by step (A/B on one machine), each with its own runtimes
// and layers, same weights and inputs; the medians over the timed steps of every rank's largest.
// Where the layers' own host times went (their HostTimes and counts_to_host_us, summed over a
// step's calls; on the call thread these are the call thread's): `host_breakdown`, rank medians.
// FEPLB_CALL_HANDOFF (host, device, memops) picks how the call thread hands off (call_queue.h).
// --hop N: the hand-off alone, without layers (see hop() below).
//   feplb_call_thread_bench --out call_thread.json [--ranks 4 --experts 64 --top-k 8 ...]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/harness/local_experts.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/trace_runner.h"
#include "feplb/core/rng.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/runtime/call_queue.h"

namespace feplb::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int ranks = 4, experts = 64, top_k = 8, layers = 4, steps = 40, warmup = 5;
  int64_t tokens = 1024, hidden = 1024, ffn = 512;
  double skew = 1.0;  // Zipf exponent of the experts' popularity
  int hop = 0;        // > 0: time the hand-off alone, this many calls per round
  std::string policy = "feplb", out;
  std::string settings = "both";  // both, off or on: which settings run (fewer streams with one)
};

// One rank's setting: its runtime and layers, on its own stream.
struct Setting {
  std::unique_ptr<EpRuntime> rt;
  std::vector<std::unique_ptr<MoeLayer>> layers;
  std::unique_ptr<Stream> stream;  // made with the runtime (a setting not run makes none)
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Zipf-routed top-k ids of one rank's tokens (distinct experts per token), and their weights.
void route(const Options& o, int rank, std::vector<int32_t>& idx, std::vector<float>& wt) {
  Rng rng(1000 + static_cast<uint64_t>(rank));
  std::vector<double> cdf(static_cast<size_t>(o.experts));
  double acc = 0;
  for (int e = 0; e < o.experts; ++e) cdf[e] = acc += 1.0 / std::pow(e + 1.0, o.skew);
  for (int64_t t = 0; t < o.tokens; ++t) {
    std::vector<int32_t> chosen;
    while (static_cast<int>(chosen.size()) < o.top_k) {
      const auto e = static_cast<int32_t>(std::min<ptrdiff_t>(
          std::upper_bound(cdf.begin(), cdf.end(), rng.uniform() * acc) - cdf.begin(),
          o.experts - 1));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int32_t e : chosen) {
      idx.push_back(e);
      wt.push_back(1.0f / static_cast<float>(o.top_k));
    }
  }
}

nlohmann::json summary(const std::vector<std::vector<double>>& per_step) {
  // per_step[step][rank] -> every step's slowest rank
  std::vector<double> worst;
  for (const auto& s : per_step) worst.push_back(*std::max_element(s.begin(), s.end()));
  return {{"median_ms", quantile(worst, 0.5)},
          {"p10_ms", quantile(worst, 0.1)},
          {"p90_ms", quantile(worst, 0.9)},
          {"steps", worst.size()}};
}

// Writes the results; 1 (with a message) where the file cannot be written.
int write_doc(const nlohmann::json& doc, const std::string& out) {
  std::ofstream f(out);
  f << doc.dump(2) << "\n";
  if (!f) {
    std::fprintf(stderr, "feplb_call_thread_bench: cannot write %s\n", out.c_str());
    return 1;
  }
  return 0;
}

// The hand-off alone: per rank thread, a caller's stream S and a CallQueue; a call's body is a
// 4-byte memset, its copy to pinned memory and the host's wait for it (a layer's wait for its
// counts). Rounds alternate the body run by the rank's thread on S and the body queued (submit
// from S, then drain and synchronize S at the round's end); per call: the round's time / N.
int hop(const Options& o) {
  request_stream_connections();
  constexpr int kRounds = 9;
  std::vector<std::vector<double>> direct(static_cast<size_t>(o.ranks)),
      queued(static_cast<size_t>(o.ranks));
  std::barrier sync_point(o.ranks);
  run_rank_threads(o.ranks, [&](int r) {
    Stream s;
    CallQueue q;
    DeviceBuffer<uint32_t> word(1);
    PinnedBuffer<uint32_t> seen(1);
    const CallQueue::Body body = [&](cudaStream_t st) {
      FEPLB_CUDA_CHECK(cudaMemsetAsync(word.get(), 0, sizeof(uint32_t), st));
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(seen.get(), word.get(), sizeof(uint32_t), cudaMemcpyDeviceToHost, st));
      FEPLB_CUDA_CHECK(cudaStreamSynchronize(st));
    };
    for (int round = -1; round < kRounds; ++round) {
      sync_point.arrive_and_wait();
      auto t0 = Clock::now();
      for (int i = 0; i < o.hop; ++i) body(s.get());
      FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
      const double d = ms_since(t0) * 1e3 / o.hop;
      sync_point.arrive_and_wait();
      t0 = Clock::now();
      for (int i = 0; i < o.hop; ++i) q.submit(s.get(), body, {});
      q.drain();
      FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
      q.raise();
      const double u = ms_since(t0) * 1e3 / o.hop;
      if (round >= 0) {
        direct[static_cast<size_t>(r)].push_back(d);
        queued[static_cast<size_t>(r)].push_back(u);
      }
    }
    sync_point.arrive_and_wait();
  });
  const char* handoff = std::getenv("FEPLB_CALL_HANDOFF");
  nlohmann::json doc = {{"ranks", o.ranks},
                        {"calls_per_round", o.hop},
                        {"rounds", kRounds},
                        {"call_handoff", handoff ? handoff : "host"}};
  for (int r = 0; r < o.ranks; ++r) {
    const auto& d = direct[static_cast<size_t>(r)];
    const auto& u = queued[static_cast<size_t>(r)];
    doc["per_rank"].push_back({{"direct_us_per_call", quantile(d, 0.5)},
                               {"queued_us_per_call", quantile(u, 0.5)},
                               {"direct_us_p10_p90", {quantile(d, 0.1), quantile(d, 0.9)}},
                               {"queued_us_p10_p90", {quantile(u, 0.1), quantile(u, 0.9)}}});
    std::printf("hop rank %d: per call, body on the caller's thread %.1f us, queued %.1f us\n", r,
                quantile(d, 0.5), quantile(u, 0.5));
  }
  return write_doc(doc, o.out);
}

int run(const Options& o) {
  if (o.hop > 0) return hop(o);
  if (o.ranks < 2) {
    std::fprintf(stderr, "feplb_call_thread_bench: the call thread needs --ranks 2 or more\n");
    return 1;
  }
  request_stream_connections();
  RuntimeConfig c;
  c.topo = Topology::contiguous(o.ranks, o.ranks, o.experts);
  c.shape = ExpertShape{o.hidden, o.ffn, Dtype::kBf16};
  c.max_top_k = o.top_k;
  c.max_tokens = o.tokens;
  c.expert_gemm = ExpertGemm::kGrouped;  // both settings: the call thread runs grouped GEMMs only
  c.staging_slots = c.topo.experts_per_rank();  // every local expert may be split onto helpers
  const char* names[2] = {"off", "on"};
  const std::vector<int> ms = o.settings == "off"  ? std::vector<int>{0}
                              : o.settings == "on" ? std::vector<int>{1}
                                                   : std::vector<int>{0, 1};
  std::vector<std::unique_ptr<InProcessGroup>> groups;
  for (int m = 0; m < 2; ++m) groups.push_back(std::make_unique<InProcessGroup>(o.ranks));
  // [setting][step][rank]
  std::vector<std::vector<std::vector<double>>> host(2), step(2);
  for (int m = 0; m < 2; ++m) {
    host[m].assign(static_cast<size_t>(o.steps), std::vector<double>(o.ranks, 0.0));
    step[m] = host[m];
  }
  // The layers' host times per step, summed over the step's calls: [setting][part][step][rank].
  const char* parts[] = {"forward_call_us",   "forward_await_us", "forward_sync_us",
                         "counts_to_host_us", "backward_call_us", "backward_await_us",
                         "backward_sync_us"};
  constexpr int kParts = 7;
  std::vector<std::vector<std::vector<std::vector<double>>>> parts_us(2);
  for (int m = 0; m < 2; ++m) parts_us[m].assign(kParts, host[m]);
  std::barrier sync_point(o.ranks);
  std::string plan_mode[2];
  int64_t copies[2] = {0, 0};  // rank 0's last step, every layer
  std::fprintf(stderr,
               "feplb_call_thread_bench: %d ranks, %d experts, top-%d, %lld tokens, %d layers\n",
               o.ranks, o.experts, o.top_k, static_cast<long long>(o.tokens), o.layers);
  run_rank_threads(o.ranks, [&](int r) {
    LocalExperts w(c.topo.experts_per_rank(), o.hidden, o.ffn, /*grads=*/true);
    const int64_t pairs = o.tokens * o.top_k;
    DeviceBuffer<__nv_bfloat16> x(static_cast<size_t>(o.tokens * o.hidden)),
        go(static_cast<size_t>(o.tokens * o.hidden));
    std::vector<DeviceBuffer<__nv_bfloat16>> out, gx;
    for (int l = 0; l < o.layers; ++l) {
      out.emplace_back(static_cast<size_t>(o.tokens * o.hidden));
      gx.emplace_back(static_cast<size_t>(o.tokens * o.hidden));
    }
    DeviceBuffer<int32_t> idx(static_cast<size_t>(pairs));
    DeviceBuffer<float> wt(static_cast<size_t>(pairs)), gw(static_cast<size_t>(pairs));
    FEPLB_CUDA_CHECK(cudaMemset(w.weights(), 0, static_cast<size_t>(w.weight_elems()) * 2));
    FEPLB_CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
    FEPLB_CUDA_CHECK(cudaMemset(go.get(), 0, go.bytes()));
    std::vector<int32_t> hidx;
    std::vector<float> hwt;
    route(o, r, hidx, hwt);
    FEPLB_CUDA_CHECK(cudaMemcpy(idx.get(), hidx.data(), idx.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(cudaMemcpy(wt.get(), hwt.data(), wt.bytes(), cudaMemcpyHostToDevice));
    Setting s[2];
    for (int m : ms) {
      RuntimeConfig cm = c;
      cm.call_thread = m == 1 ? CallThread::kOn : CallThread::kOff;
      cm.name = std::string("bench.") + names[m];
      s[m].stream = std::make_unique<Stream>();
      s[m].rt = std::make_unique<EpRuntime>(cm, groups[m]->endpoint(r));
      for (int l = 0; l < o.layers; ++l) {
        s[m].layers.push_back(
            std::make_unique<MoeLayer>(*s[m].rt, LayerConfig{o.top_k, "layer" + std::to_string(l)},
                                       make_gpu_planner(*s[m].rt, o.policy)));
      }
    }
    if (r == 0) std::fprintf(stderr, "  runtimes and layers made\n");
    // A rank's buffers are freed only after every rank's last call: freeing device memory waits
    // for the whole GPU, other virtual ranks' queued calls included.
    for (int i = -o.warmup; i < o.steps; ++i) {
      for (int m : ms) {
        Setting& st = s[m];
        sync_point.arrive_and_wait();
        const auto t0 = Clock::now();
        std::vector<MicroBatch> mbs;
        for (int l = 0; l < o.layers; ++l) {
          mbs.push_back(st.layers[l]->forward(w.params(), x.get(), idx.get(), wt.get(), o.tokens,
                                              out[l].get(), st.stream->get()));
        }
        for (int l = o.layers - 1; l >= 0; --l) {
          st.layers[l]->backward(std::move(mbs[l]), w.params(), go.get(), wt.get(), gx[l].get(),
                                 gw.get(), w.grad_views(), GradMode::kAccumulate, st.stream->get());
        }
        for (auto& layer : st.layers) layer->sync_gradients(st.stream->get());
        const double enqueue_ms = ms_since(t0);
        st.rt->synchronize(st.stream->get());
        const double step_ms = ms_since(t0);
        if (i >= 0) {
          host[m][i][r] = enqueue_ms;
          step[m][i][r] = step_ms;
          for (auto& layer : st.layers) {
            const ForwardStats& f = layer->last_forward_stats();
            const BackwardStats& b = layer->last_backward_stats();
            const double v[kParts] = {f.host.call_us,      f.host.await_us, f.host.sync_us,
                                      f.counts_to_host_us, b.host.call_us,  b.host.await_us,
                                      b.host.sync_us};
            for (int p = 0; p < kParts; ++p) parts_us[m][p][i][r] += v[p];
          }
        }
      }
      // Progress: every warm-up step (a stall seen so far came in the first steps), then every
      // 10th.
      if (r == 0 && i < 0)
        std::fprintf(stderr, "  warm-up step %d of %d\n", i + o.warmup + 1, o.warmup);
      if (r == 0 && (i + 1) % 10 == 0) std::fprintf(stderr, "  step %d of %d\n", i + 1, o.steps);
    }
    if (r == 0) {
      for (int m : ms) {
        plan_mode[m] = s[m].layers[0]->last_plan().mode;
        for (auto& layer : s[m].layers) copies[m] += layer->last_forward_stats().copies;
      }
    }
    sync_point.arrive_and_wait();
  });
  nlohmann::json doc;
  doc["config"] = {{"ranks", o.ranks},   {"experts", o.experts}, {"top_k", o.top_k},
                   {"tokens", o.tokens}, {"hidden", o.hidden},   {"ffn", o.ffn},
                   {"layers", o.layers}, {"steps", o.steps},     {"warmup", o.warmup},
                   {"skew", o.skew},     {"policy", o.policy}};
  int device = 0;
  cudaDeviceProp p{};
  FEPLB_CUDA_CHECK(cudaGetDevice(&device));
  FEPLB_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  doc["device"] = p.name;
  const char* handoff = std::getenv("FEPLB_CALL_HANDOFF");
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  doc["call_handoff"] = handoff ? handoff : "host";
  doc["cuda_device_max_connections"] = connections ? connections : "";
  for (int m : ms) {
    doc["settings"][names[m]] = {{"caller_host", summary(host[m])},
                                 {"step", summary(step[m])},
                                 {"rank0_plan_mode", plan_mode[m]},
                                 {"rank0_copies_last_step", copies[m]}};
    for (int q = 0; q < kParts; ++q) {
      std::vector<double> med;  // per rank: the median step
      for (int r = 0; r < o.ranks; ++r) {
        std::vector<double> v;
        for (const auto& s : parts_us[m][q]) v.push_back(s[r]);
        med.push_back(quantile(v, 0.5));
      }
      doc["settings"][names[m]]["host_breakdown"][parts[q]] = {
          {"rank_median_us_min", *std::min_element(med.begin(), med.end())},
          {"rank_median_us_max", *std::max_element(med.begin(), med.end())}};
    }
    const auto& h = doc["settings"][names[m]]["caller_host"];
    const auto& t = doc["settings"][names[m]]["step"];
    std::printf(
        "call thread %-3s  caller's host time per step: median %.3f ms (p10 %.3f, p90 %.3f)"
        "  step: median %.3f ms (p10 %.3f, p90 %.3f)  plan '%s', %lld copies\n",
        names[m], h["median_ms"].get<double>(), h["p10_ms"].get<double>(),
        h["p90_ms"].get<double>(), t["median_ms"].get<double>(), t["p10_ms"].get<double>(),
        t["p90_ms"].get<double>(), plan_mode[m].c_str(), static_cast<long long>(copies[m]));
    std::printf("  per step, summed over calls (us, slowest rank's median):");
    for (int q = 0; q < kParts; ++q) {
      std::printf(" %s %.0f", parts[q],
                  doc["settings"][names[m]]["host_breakdown"][parts[q]]["rank_median_us_max"]
                      .get<double>());
    }
    std::printf("\n");
  }
  return write_doc(doc, o.out);
}

}  // namespace
}  // namespace feplb::cuda

int main(int argc, char** argv) {
  feplb::cuda::Options o;
  CLI::App app("feplb_call_thread_bench: the runtime's call thread on and off, virtual ranks");
  app.add_option("--ranks", o.ranks, "virtual ranks (--hop: 1 or more)")->check(CLI::Range(1, 64));
  app.add_option("--experts", o.experts, "experts (a multiple of the ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--top-k", o.top_k, "experts per token")->check(CLI::PositiveNumber);
  app.add_option("--tokens", o.tokens, "tokens per rank")->check(CLI::PositiveNumber);
  app.add_option("--hidden", o.hidden, "hidden size (a multiple of 8)")->check(CLI::PositiveNumber);
  app.add_option("--ffn", o.ffn, "expert FFN size (a multiple of 8)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "layers per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "timed steps per setting")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--skew", o.skew, "Zipf exponent of expert popularity")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--policy", o.policy, "the layers' planner");
  app.add_option("--hop", o.hop, "time the hand-off alone: calls per round")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--settings", o.settings,
                 "which settings run: both, off or on (each its own runtimes)")
      ->check(CLI::IsMember({"both", "off", "on"}));
  app.add_option("--out", o.out, "JSON results")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    return feplb::cuda::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb_call_thread_bench: %s\n", e.what());
    return 1;
  }
}
