// feplb_peer_bench: GPU-to-GPU data movement on one node, one process per GPU (torchrun-style
// environment; scripts/gpu-dist starts them). Ranks pair up 0<->1, 2<->3, ... and push into the
// partner's CUDA IPC-mapped buffer. Measured with CUDA events after warm-up, median and p10/p90
// of many repetitions, each repetition's time the max over ranks:
//   * copy-engine peer copies (cudaMemcpyAsync to the peer pointer), one direction and both;
//   * an SM copy kernel on 24 and 32 blocks writing the peer pointer (what SM transports reserve);
//   * NCCL send/recv of the same bytes;
//   * the slowdown of a bf16 GEMM on rank 0 while every other rank pushes into it on the copy
//     engine (A/B interleaved, median ratio);
//   * the latency of each signal mechanism (Transport::Signals) between ranks 0 and 1: a ping
//     (0 -> 1) answered by a pong (1 -> 0), timed on rank 0 with CUDA events, median and p99.
//     --same-gpu runs only this section with every rank on GPU 0 (two processes on one GPU; no
//     NCCL, which refuses two ranks on one GPU: the sets are made over the TCP rendezvous).
// Usage: scripts/gpu-dist 2 build/bin/feplb_peer_bench --out bench/results/h200-x2.json [--quick]
//        scripts/gpu-dist 2 build/bin/feplb_peer_bench --same-gpu --out h200-x1-signals.json
//        (--signals-only: the signal section alone, one process per GPU)
#include <cuda_bf16.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "bench/harness/kernels/kernels.h"
#include "feplb/core/stats.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/transport/ipc_signals.h"
#include "feplb/cuda/transport/stream_ops.h"
#include "feplb/dist/launch.h"

namespace feplb::cuda {
namespace {

using json = nlohmann::ordered_json;
using bf16 = __nv_bfloat16;

constexpr double kTimeoutS = 120;

struct Options {
  std::string out;
  int reps = 30, warmup = 3, gemm_pairs = 15;
  int signal_reps = 500, signal_warmup = 50;
  double signal_delay_us = 500;
  bool quick = false, signals_only = false, same_gpu = false;
};

void log0(int rank, const std::string& s) {
  if (rank != 0) return;
  std::fputs(s.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

json spread(const std::vector<double>& v) {
  return json{{"median", quantile_of(v, 0.5)},
              {"p10", quantile_of(v, 0.1)},
              {"p90", quantile_of(v, 0.9)},
              {"n", v.size()}};
}

std::string size_key(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? fmt::format("{}MiB", bytes >> 20)
                                    : fmt::format("{}KiB", bytes >> 10);
}

// The collective plumbing every measurement shares: a barrier and the max over ranks of a time,
// both through the transport's all-gather (bounded waits).
class Group {
 public:
  Group(Transport& t, cudaStream_t s)
      : t_(t), s_(s), one_(1), all_(static_cast<size_t>(t.world_size())) {}
  int rank() const { return t_.rank(); }
  int world() const { return t_.world_size(); }
  // Every rank's `ms`; returns the largest.
  double max_ms(double ms) {
    const float f = static_cast<float>(ms);
    int32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(one_.get(), &bits, sizeof(bits), cudaMemcpyHostToDevice, s_));
    t_.all_gather_i32(one_.get(), all_.get(), 1, s_);
    std::vector<int32_t> h(all_.size());
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(h.data(), all_.get(), all_.bytes(), cudaMemcpyDeviceToHost, s_));
    sync_with_timeout(s_, kTimeoutS, "peer bench: all-gather of times");
    double m = 0;
    for (int32_t b : h) {
      float x = 0;
      std::memcpy(&x, &b, sizeof(x));
      m = std::max(m, static_cast<double>(x));
    }
    return m;
  }
  void barrier() { max_ms(0); }

 private:
  Transport& t_;
  cudaStream_t s_;
  DeviceBuffer<int32_t> one_, all_;
};

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path);
  FEPLB_CHECK(f.good(), "cannot write {}", path);
  f << j.dump(2) << "\n";
  FEPLB_CHECK(f.good(), "writing {} failed", path);
}

// One signal set, made collectively (the transport's make_signals, or make_ipc_signals over the
// TCP rendezvous).
using MakeSignals = std::function<std::unique_ptr<Transport::Signals>(
    const std::string& name, int count, SignalMechanism m)>;

json latency_spread(const std::vector<double>& v) {
  return json{{"median", quantile_of(v, 0.5)},
              {"p90", quantile_of(v, 0.9)},
              {"p99", quantile_of(v, 0.99)},
              {"max", quantile_of(v, 1.0)},
              {"n", v.size()}};
}

// Ping-pong rounds of one mechanism between ranks 0 and 1 (signal values from `v` on), with a GPU
// delay first on rank 0 (`pre`: every call issued before the GPU starts the ping) or without; rank
// 0 returns the round trips' spread, the others null.
json ping_pong(Transport::Signals& sig, const std::string& mname, bool pre, int rank,
               const Options& o, uint32_t& v) {
  Stream s;
  Event e0(true), e1(true);
  std::vector<double> rtt_us;
  int late = 0;
  for (int i = 0; i < o.signal_warmup + o.signal_reps; ++i) {
    ++v;
    if (rank == 0) {
      if (pre) {
        FEPLB_CUDA_CHECK(
            kernels::gpu_delay(static_cast<int64_t>(o.signal_delay_us * 1e3), s.get()));
      }
      e0.record(s.get());
      sig.signal(1, 0, v, s.get());
      sig.wait(1, v, s.get());
      e1.record(s.get());
      if (pre) {
        const cudaError_t q = cudaEventQuery(e0.get());
        if (q == cudaSuccess) {
          ++late;
        } else if (q != cudaErrorNotReady) {
          FEPLB_CUDA_CHECK(q);
        }
      }
      sync_with_timeout(s.get(), kTimeoutS, "peer bench: signal round trip");
      if (i >= o.signal_warmup) rtt_us.push_back(1e3 * elapsed_ms(e0, e1));
    } else if (rank == 1) {
      sig.wait(0, v, s.get());
      sig.signal(0, 1, v, s.get());
    }
  }
  sync_with_timeout(s.get(), kTimeoutS, "peer bench: signal round trips");
  json r;
  if (rank == 0) {
    r = json{{"round_trip_us", latency_spread(rtt_us)},
             {"one_way_us_median", quantile_of(rtt_us, 0.5) / 2},
             {"one_way_us_p99", quantile_of(rtt_us, 0.99) / 2}};
    if (pre) r["late"] = late;
    log0(rank,
         fmt::format(
             "signal {:>8} {:>13}: one way {:6.2f} us median, {:6.2f} us p99 (round trip / 2)",
             mname, pre ? "pre-enqueued" : "host-issued", quantile_of(rtt_us, 0.5) / 2,
             quantile_of(rtt_us, 0.99) / 2));
  }
  return r;
}

// Latency of each signal mechanism between ranks 0 and 1 (the other ranks make the sets and
// idle). Per repetition rank 0 records e0, signals slot 0 of rank 1 (ping), waits on its own slot
// 1, records e1; rank 1 waits on slot 0 and signals slot 1 of rank 0 (pong). Round trip = e1 - e0
// on rank 0's GPU; one way = half of it. Two ways to issue it:
//   pre_enqueued: rank 0's stream first runs a `signal_delay_us` GPU delay, so both hosts have
//     issued everything (events: the waiter's host saw the record) before the GPU reaches e0: the
//     GPU-side latency. `late` counts repetitions where e0 had already passed when rank 0's host
//     finished issuing (those include host time).
//   host_issued: no delay; each call goes in when the host gets to it (events: the waiter's host
//     spins until the signaller's host recorded): what a caller that issues as it goes sees.
// `barrier` synchronises every rank (between mechanisms).
json signal_latency(const MakeSignals& make, int rank, const Options& o,
                    const std::function<void()>& barrier) {
  int device = 0;
  FEPLB_CUDA_CHECK(cudaGetDevice(&device));
  json out;
  for (SignalMechanism m :
       {SignalMechanism::kEvent, SignalMechanism::kStreamMemop, SignalMechanism::kCeFlag}) {
    const std::string mname(signal_mechanism_name(m));
    const auto sig = make("peer_bench.latency." + mname, 2, m);
    uint32_t v = 0;
    json per;
    for (const bool pre : {true, false}) {
      const json r = ping_pong(*sig, mname, pre, rank, o, v);
      if (rank == 0) per[pre ? "pre_enqueued" : "host_issued"] = r;
    }
    barrier();  // nobody destroys a set a peer may still use
    out["mechanisms"][mname] = per;
  }
  out["can_flush_remote_writes"] = can_flush_remote_writes(device);
  out["reps"] = o.signal_reps;
  out["warmup"] = o.signal_warmup;
  out["delay_us"] = o.signal_delay_us;
  out["definitions"] = json{
      {"round_trip_us",
       "rank 0: e1 - e0 around signal(rank 1, ping) + wait(pong); rank 1: wait(ping) + "
       "signal(rank 0, pong); CUDA events on rank 0's stream"},
      {"one_way_us",
       "round trip / 2: one signal -> wait satisfied -> next work on the waiter's stream"},
      {"pre_enqueued",
       "a GPU delay of delay_us first on rank 0, so every call is issued before the GPU starts "
       "the ping (late: repetitions where it was not)"},
      {"host_issued",
       "no delay: calls go in as the hosts reach them (events: the waiter's host spins until the "
       "signaller's host recorded)"},
      {"event",
       "CUDA interprocess events; the waiter's host waits for the signaller's host record"},
      {"memop",
       "system-scope memory barrier + 32-bit stream write into the peer's flag; stream wait (GEQ)"},
      {"ce-flag",
       "stream write into a local word, copied into the peer's flag by the copy engine; stream "
       "wait"}};
  return out;
}

// --same-gpu: every rank on GPU 0, the signal sets made over the TCP rendezvous; only the signal
// latency is measured.
int run_same_gpu(const Options& o, const dist::LaunchEnv& env) {
  FEPLB_CUDA_CHECK(cudaSetDevice(0));
  const AllGatherBlobs gather = [&env](const std::string& blob) {
    return dist::rendezvous_all_gather(env, blob, kTimeoutS);
  };
  const std::vector<DeviceInfo> devices = list_devices();
  log0(env.rank, fmt::format("feplb_peer_bench --same-gpu: {} processes on GPU 0 ({})",
                             env.world_size, devices.empty() ? std::string("?") : devices[0].name));
  const MakeSignals make = [&](const std::string& name, int count, SignalMechanism m) {
    return make_ipc_signals(name, count, env.rank, env.world_size, gather, m, kTimeoutS);
  };
  const json latency = signal_latency(make, env.rank, o, [&] { gather("barrier"); });
  if (env.rank == 0 && !o.out.empty()) {
    json j;
    j["device"] = devices.empty() ? "" : devices[0].name;
    j["world_size"] = env.world_size;
    j["placement"] = "every process on GPU 0 (--same-gpu)";
    j["signal_latency"] = latency;
    write_json(o.out, j);
    log0(env.rank, "wrote " + o.out);
  }
  return 0;
}

// Rank r's partner (r ^ 1), or -1 for the last rank of an odd world.
int partner_of(int rank, int world) {
  const int p = rank ^ 1;
  return p < world ? p : -1;
}

// One measured operation: enqueues `iters` transfers of `bytes` on the stream (or nothing when
// this rank is idle in it).
using Op = std::function<void(size_t bytes, int iters, cudaStream_t s)>;

// GB/s per repetition: iters * bytes / (max over ranks of the time).
std::vector<double> measure(Group& g, cudaStream_t s, const Op& op, size_t bytes,
                            const Options& o) {
  // Small copies repeat back to back (about 64 MiB per repetition), so launch gaps do not count.
  const int iters = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / bytes, 1, 256));
  Event e0(true), e1(true);
  std::vector<double> gbps;
  for (int i = 0; i < o.warmup + o.reps; ++i) {
    g.barrier();
    e0.record(s);
    op(bytes, iters, s);
    e1.record(s);
    sync_with_timeout(s, kTimeoutS, "peer bench: a measured transfer");
    const double ms = g.max_ms(elapsed_ms(e0, e1));
    if (i >= o.warmup) gbps.push_back(static_cast<double>(bytes) * iters / (ms * 1e-3) / 1e9);
  }
  return gbps;
}

void gemm(cublasHandle_t h, cudaStream_t s, const bf16* a, const bf16* b, bf16* c, int m, int n,
          int k) {
  const float one = 1.0f, zero = 0.0f;
  FEPLB_CUBLAS_CHECK(cublasSetStream(h, s));
  // Row-major C[m, n] = A[m, k] B[k, n], as column-major C^T = B^T A^T.
  FEPLB_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, n, a,
                                  CUDA_R_16BF, k, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

// One rank's side of the pair measurements: its transport, partner, stream, group and buffers.
struct PeerRun {
  Transport& t;
  int rank, world, partner;
  size_t max_bytes;
  cudaStream_t s;
  Group& g;
  DeviceBuffer<char>& src;
  DeviceBuffer<char>& nccl_recv;
  char* peer_dst;  // the partner's registered buffer, as addressed here (null without a partner)
};

// Peer bandwidth by method, direction and size (GB/s spreads), the largest median of any, and the
// one-direction copy-engine medians by size.
struct Bandwidths {
  json ce, sm, nccl, ce_pct;
  double peak = 0;
  std::vector<std::pair<size_t, double>> ce_one_dir;
};

Bandwidths measure_bandwidths(const PeerRun& p, const std::vector<size_t>& sizes,
                              const Options& o) {
  // Who moves data in each direction mode: one direction = the even rank of each pair pushes.
  auto active = [&](bool both) { return p.partner >= 0 && (both || p.rank % 2 == 0); };
  auto ce = [&](bool both) -> Op {
    return [&, both](size_t bytes, int iters, cudaStream_t st) {
      if (!active(both)) return;
      for (int i = 0; i < iters; ++i) {
        FEPLB_CUDA_CHECK(
            cudaMemcpyAsync(p.peer_dst, p.src.get(), bytes, cudaMemcpyDeviceToDevice, st));
      }
    };
  };
  auto sm = [&](bool both, int blocks) -> Op {
    return [&, both, blocks](size_t bytes, int iters, cudaStream_t st) {
      if (!active(both)) return;
      for (int i = 0; i < iters; ++i)
        FEPLB_CUDA_CHECK(kernels::sm_copy(p.src.get(), p.peer_dst, bytes, blocks, 0.0, st));
    };
  };
  auto nccl = [&](bool both) -> Op {
    return [&, both](size_t bytes, int iters, cudaStream_t st) {
      if (p.partner < 0) return;
      const bool sends = both || p.rank % 2 == 0, recvs = both || p.rank % 2 == 1;
      for (int i = 0; i < iters; ++i) {
        std::vector<Chunk> out, in;
        if (sends) out.push_back({p.partner, p.src.get(), bytes});
        if (recvs) in.push_back({p.partner, p.nccl_recv.get(), bytes});
        p.t.exchange(out, in, st);
      }
    };
  };
  Bandwidths bw;
  for (const bool both : {false, true}) {
    const char* dir = both ? "both_directions" : "one_direction";
    for (size_t bytes : sizes) {
      const auto c = measure(p.g, p.s, ce(both), bytes, o);
      const auto s24 = measure(p.g, p.s, sm(both, 24), bytes, o);
      const auto s32 = measure(p.g, p.s, sm(both, 32), bytes, o);
      const auto n = measure(p.g, p.s, nccl(both), bytes, o);
      const std::string key = size_key(bytes);
      bw.ce[dir][key] = spread(c);
      bw.sm["24_blocks"][dir][key] = spread(s24);
      bw.sm["32_blocks"][dir][key] = spread(s32);
      bw.nccl[dir][key] = spread(n);
      for (const auto* v : {&c, &s24, &s32, &n}) bw.peak = std::max(bw.peak, quantile_of(*v, 0.5));
      if (!both) bw.ce_one_dir.emplace_back(bytes, quantile_of(c, 0.5));
      log0(p.rank,
           fmt::format(
               "{:>15} {:>7}: CE {:7.1f}  SM24 {:7.1f}  SM32 {:7.1f}  NCCL {:7.1f} GB/s (medians)",
               dir, key, quantile_of(c, 0.5), quantile_of(s24, 0.5), quantile_of(s32, 0.5),
               quantile_of(n, 0.5)));
    }
  }
  for (const auto& [bytes, gbps] : bw.ce_one_dir) {
    if (bytes >= (size_t{64} << 20)) bw.ce_pct[size_key(bytes)] = 100.0 * gbps / bw.peak;
  }
  return bw;
}

// A bf16 GEMM on rank 0 alone and while every other rank pushes into it on the copy engine,
// interleaved pairs: each pair's times (max over ranks) and their ratio.
struct GemmUnderPush {
  int m = 8192, n = 4096, k = 6144;
  std::vector<double> alone, pushed, ratio;
  double slowdown_pct = 0;
};

GemmUnderPush gemm_under_push(const PeerRun& p, const Bandwidths& bw, const Options& o) {
  GemmUnderPush r;
  const int m = r.m, n = r.n, k = r.k;
  CublasHandle cublas;
  DeviceBuffer<bf16> a, b, c;
  if (p.rank == 0) {
    a = DeviceBuffer<bf16>(static_cast<size_t>(m) * k);
    b = DeviceBuffer<bf16>(static_cast<size_t>(k) * n);
    c = DeviceBuffer<bf16>(static_cast<size_t>(m) * n);
    FEPLB_CUDA_CHECK(kernels::fill_random(a.get(), a.size(), 11, 1.0f, p.s));
    FEPLB_CUDA_CHECK(kernels::fill_random(b.get(), b.size(), 12, 1.0f, p.s));
    for (int i = 0; i < 3; ++i) gemm(cublas.get(), p.s, a.get(), b.get(), c.get(), m, n, k);
  }
  char* victim_dst =
      p.rank == 0 ? nullptr : static_cast<char*>(p.t.peer_buffer("peer_bench.dst", 0));
  Event e0(true), e1(true);
  // Push long enough to cover the GEMM with margin: 64 MiB copies for about 3 GEMM times at the
  // best copy-engine rate measured.
  auto time_gemm = [&](bool pushed, double push_ms) {
    p.g.barrier();
    if (p.rank == 0) {
      if (pushed) FEPLB_CUDA_CHECK(kernels::gpu_delay(50'000, p.s));  // let the pushes start
      e0.record(p.s);
      gemm(cublas.get(), p.s, a.get(), b.get(), c.get(), m, n, k);
      e1.record(p.s);
    } else if (pushed) {
      const size_t chunk = std::min<size_t>(size_t{64} << 20, p.max_bytes);
      const double best_gbps =
          std::max(1.0, bw.ce_one_dir.empty() ? 100.0 : bw.ce_one_dir.back().second);
      const int copies = std::max(
          1, static_cast<int>(3 * push_ms * 1e-3 * best_gbps * 1e9 / static_cast<double>(chunk)));
      for (int i = 0; i < copies; ++i) {
        FEPLB_CUDA_CHECK(
            cudaMemcpyAsync(victim_dst, p.src.get(), chunk, cudaMemcpyDeviceToDevice, p.s));
      }
    }
    sync_with_timeout(p.s, kTimeoutS, "peer bench: GEMM under peer pushes");
    return p.g.max_ms(p.rank == 0 ? elapsed_ms(e0, e1) : 0.0);
  };
  const double first = time_gemm(false, 0);
  for (int i = 0; i < o.gemm_pairs; ++i) {
    const double x = time_gemm(false, 0), y = time_gemm(true, first);
    r.alone.push_back(x);
    r.pushed.push_back(y);
    r.ratio.push_back(y / x);
  }
  r.slowdown_pct = (quantile_of(r.ratio, 0.5) - 1.0) * 100.0;
  log0(p.rank, fmt::format("GEMM {}x{}x{} bf16 on rank 0: {:.3f} ms alone, {:.3f} ms while {} "
                           "peer(s) push: {:+.1f}%",
                           m, n, k, quantile_of(r.alone, 0.5), quantile_of(r.pushed, 0.5),
                           p.world - 1, r.slowdown_pct));
  return r;
}

// The results document (rank 0).
json peer_document(const std::string& device, int world, const Options& o,
                   const std::vector<size_t>& sizes, const Bandwidths& bw, const GemmUnderPush& gm,
                   const json& latency) {
  json j;
  j["device"] = device;
  j["world_size"] = world;
  j["pairs"] = world / 2;
  j["reps"] = o.reps;
  j["warmup"] = o.warmup;
  j["sizes_bytes"] = sizes;
  j["ce_peer_gbps_by_size"] = bw.ce;
  j["sm_peer_gbps_by_size"] = bw.sm;
  j["nccl_gbps_by_size"] = bw.nccl;
  j["peak_gbps"] = bw.peak;
  j["ce_pct_of_peak"] = bw.ce_pct;
  j["gemm"] = json{{"shape_mnk", {gm.m, gm.n, gm.k}},
                   {"alone_ms", spread(gm.alone)},
                   {"peer_push_ms", spread(gm.pushed)},
                   {"ratio", spread(gm.ratio)},
                   {"pushing_ranks", world - 1}};
  j["gemm_slowdown_peer_push_pct"] = gm.slowdown_pct;
  j["placement"] = "one process per GPU";
  j["signal_latency"] = latency;
  j["definitions"] = json{
      {"gbps",
       "bytes moved per direction / time, 1e9 bytes per GB; each repetition's time is the max "
       "over ranks; small sizes repeat back to back (about 64 MiB per repetition)"},
      {"one_direction", "the even rank of each pair (0<->1, 2<->3, ...) writes into its partner"},
      {"both_directions",
       "both ranks of each pair write into each other at once; the rate is per direction"},
      {"ce", "cudaMemcpyAsync into the partner's CUDA IPC-mapped buffer (copy engine)"},
      {"sm", "kernels::sm_copy on 24 or 32 blocks storing to the partner's mapped buffer"},
      {"nccl", "ncclSend/ncclRecv in one group per transfer"},
      {"peak_gbps", "the largest median measured here, any method"},
      {"ce_pct_of_peak", "one-direction CE median / peak_gbps, sizes >= 64 MiB"},
      {"gemm_slowdown_peer_push_pct",
       "(median over interleaved pairs of pushed / alone GEMM time - 1) * 100"},
      {"signal_latency", "see signal_latency.definitions"}};
  return j;
}

int run(const Options& o, const dist::LaunchEnv& env) {
  NcclCommunicator comm(env, kTimeoutS);
  const auto t = comm.transport();
  const int rank = t->rank(), world = t->world_size(), partner = partner_of(rank, world);
  if (!t->supports_peer_copies())
    throw Error("peer memory is not reachable between these GPUs (see the log)");
  const size_t max_bytes = o.quick ? size_t{64} << 20 : size_t{256} << 20;
  std::vector<size_t> sizes;
  for (size_t b = size_t{64} << 10; b <= max_bytes; b *= 4) sizes.push_back(b);
  Stream s;
  Group g(*t, s.get());
  DeviceBuffer<char> src(max_bytes), dst(max_bytes), nccl_recv(max_bytes);
  FEPLB_CUDA_CHECK(kernels::fill_random(reinterpret_cast<bf16*>(src.get()), max_bytes / 2,
                                        7 + static_cast<uint64_t>(rank), 1.0f, s.get()));
  sync_with_timeout(s.get(), kTimeoutS, "fill");
  t->register_buffer("peer_bench.dst", dst.get(), dst.bytes());
  char* peer_dst =
      partner >= 0 ? static_cast<char*>(t->peer_buffer("peer_bench.dst", partner)) : nullptr;
  const std::vector<DeviceInfo> devices = list_devices();
  const std::string device = devices.empty() ? "" : devices[0].name;
  log0(rank, fmt::format("feplb_peer_bench: {} ranks, {} pairs, {}", world, world / 2,
                         devices.empty() ? std::string("?") : device));

  const MakeSignals make = [&](const std::string& name, int count, SignalMechanism m) {
    return t->make_signals(name, count, m);
  };
  const json latency = signal_latency(make, rank, o, [&] { g.barrier(); });
  if (o.signals_only) {
    if (rank == 0 && !o.out.empty()) {
      json j;
      j["device"] = device;
      j["world_size"] = world;
      j["placement"] = "one process per GPU";
      j["signal_latency"] = latency;
      write_json(o.out, j);
      log0(rank, "wrote " + o.out);
    }
    g.barrier();
    return 0;
  }
  const PeerRun p{*t, rank, world, partner, max_bytes, s.get(), g, src, nccl_recv, peer_dst};
  const Bandwidths bw = measure_bandwidths(p, sizes, o);
  const GemmUnderPush gm = gemm_under_push(p, bw, o);
  if (rank == 0 && !o.out.empty()) {
    write_json(o.out, peer_document(device, world, o, sizes, bw, gm, latency));
    log0(rank, "wrote " + o.out);
  }
  g.barrier();  // nobody unmaps or frees while a peer may still write
  return 0;
}

}  // namespace
}  // namespace feplb::cuda

int main(int argc, char** argv) {
  feplb::cuda::Options o;
  CLI::App app{
      "feplb_peer_bench: peer copy-engine, SM and NCCL bandwidth, and GEMM slowdown under peer "
      "pushes"};
  app.add_option("--out", o.out, "JSON results (written by rank 0)");
  app.add_option("--reps", o.reps, "timed repetitions per point")->check(CLI::Range(1, 10000));
  app.add_option("--warmup", o.warmup, "untimed repetitions first")->check(CLI::Range(0, 1000));
  app.add_option("--gemm-pairs", o.gemm_pairs, "interleaved GEMM alone / pushed pairs")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--quick", o.quick, "sizes up to 64 MiB, fewer repetitions");
  app.add_flag("--signals-only", o.signals_only,
               "measure only the signal latency (one process per GPU)");
  app.add_flag("--same-gpu", o.same_gpu,
               "every rank on GPU 0, signal latency only (two processes on one GPU; no NCCL)");
  app.add_option("--signal-reps", o.signal_reps, "timed signal round trips per mechanism and way")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--signal-warmup", o.signal_warmup, "untimed signal round trips first")
      ->check(CLI::Range(0, 100000));
  app.add_option("--signal-delay-us", o.signal_delay_us, "GPU delay before each pre-enqueued ping")
      ->check(CLI::Range(0.0, 1e6));
  CLI11_PARSE(app, argc, argv);
  if (o.quick) {
    o.reps = std::min(o.reps, 10);
    o.gemm_pairs = std::min(o.gemm_pairs, 5);
    o.signal_reps = std::min(o.signal_reps, 100);
    o.signal_warmup = std::min(o.signal_warmup, 10);
  }
  try {
    const feplb::dist::LaunchEnv env = feplb::dist::launch_env_from_process();
    if (env.world_size < 2) {
      std::fprintf(
          stderr,
          "feplb_peer_bench: WORLD_SIZE is %d, nothing to measure: start one process per GPU "
          "(scripts/gpu-dist N feplb_peer_bench ...)\n",
          env.world_size);
      return 2;
    }
    return o.same_gpu ? feplb::cuda::run_same_gpu(o, env) : feplb::cuda::run(o, env);
  } catch (const feplb::InputError& e) {
    std::fprintf(stderr, "feplb_peer_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb_peer_bench: rank error: %s\n", e.what());
    return 1;
  }
}
