// feplb_handoff_probe: can a caller's stream wait on a flag that a stream enqueued *later* (by
// another host thread, after the caller's thread returned) sets, on the same GPU? That is the
// hand-off a layer needs so that its caller never waits for counts: the caller enqueues a
// stream-memory wait and returns; the scheduler thread enqueues the body later on a stream of its
// own, whose last operation releases the wait. cuStreamWaitValue32 documents that such an order
// is invisible to CUDA's scheduler and may deadlock: when the two streams share a hardware queue
// the wait sits ahead of the body. This probe measures when it does.
//
// Per case: a fresh caller stream, `fillers` streams created after it, then the body stream
// (normal or highest priority); the flag is a word of pinned host memory. The caller's stream:
// wait(flag >= v), then it copies a marker the body sets into pinned memory (0 there = released
// before the body: a wrong order). The body: 200 us of GPU delay, the marker, then the release (a
// stream write of v, or the host writing v once the body's event completed). A caller still waiting
// after --stall-ms is a stall; the host then writes the flag itself, so the probe always ends. Run
// it under CUDA_DEVICE_MAX_CONNECTIONS = 1, 8 (the default) and 32: streams take hardware queues
// round robin in creation order.
//   feplb_handoff_probe --out handoff.json [--stall-ms 300]
#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness/kernels/kernels.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/transport/stream_ops.h"

namespace feplb::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// The last step a case reached, and a watchdog that ends the probe (exit 3) when a case takes
// more than 5 s: a wait the host's write did not release.
std::atomic<const char*> g_step{"start"};
std::atomic<int64_t> g_case_start_ns{0};
void step(const char* s) { g_step.store(s); }
void start_watchdog() {
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t t0 = g_case_start_ns.load();
      const int64_t now = Clock::now().time_since_epoch().count();
      if (t0 > 0 && now - t0 > 5'000'000'000) {
        std::fprintf(stderr, "feplb_handoff_probe: a case hung at step '%s'\n", g_step.load());
        std::_Exit(3);
      }
    }
  }).detach();
}

enum class Caller { kCreated, kLegacyDefault, kPerThreadDefault };
enum class Release { kStreamWrite, kHostWrite };

const char* name(Caller c) {
  switch (c) {
    case Caller::kCreated:
      return "created";
    case Caller::kLegacyDefault:
      return "legacy-default";
    case Caller::kPerThreadDefault:
      return "per-thread-default";
  }
  return "?";
}

struct Case {
  Caller caller = Caller::kCreated;
  int fillers = 0;
  bool body_high_priority = false;
  Release release = Release::kStreamWrite;
};

struct Outcome {
  bool stalled = false;
  bool early = false;  // the caller's work saw the marker unset
  double release_us = 0;
};

// Pinned, mapped host memory holding the flag (host case) and the marker's copy.
struct Pinned {
  uint32_t* host = nullptr;
  uint32_t* dev = nullptr;
  Pinned() {
    FEPLB_CUDA_CHECK(cudaHostAlloc(&host, 64, cudaHostAllocMapped));
    FEPLB_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
  }
  ~Pinned() { cudaFreeHost(host); }
};

bool wait_event(cudaEvent_t ev, double ms) {
  const auto end = Clock::now() + std::chrono::duration<double, std::milli>(ms);
  for (;;) {
    const cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) FEPLB_CUDA_CHECK(q);
    if (Clock::now() > end) return false;
  }
}

Outcome run_case(const Case& c, uint32_t v, Pinned& pin, uint32_t* dev_words, double stall_ms) {
  g_case_start_ns.store(Clock::now().time_since_epoch().count());
  step("streams");
  int lo = 0, hi = 0;
  FEPLB_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t caller = c.caller == Caller::kLegacyDefault      ? cudaStreamLegacy
                        : c.caller == Caller::kPerThreadDefault ? cudaStreamPerThread
                                                                : nullptr;
  if (c.caller == Caller::kCreated)
    FEPLB_CUDA_CHECK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  std::vector<cudaStream_t> fillers(static_cast<size_t>(c.fillers));
  for (auto& s : fillers) FEPLB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaStream_t body = nullptr;
  FEPLB_CUDA_CHECK(
      cudaStreamCreateWithPriority(&body, cudaStreamNonBlocking, c.body_high_priority ? hi : lo));
  cudaEvent_t caller_done = nullptr, body_done = nullptr;
  FEPLB_CUDA_CHECK(cudaEventCreateWithFlags(&caller_done, cudaEventDisableTiming));
  FEPLB_CUDA_CHECK(cudaEventCreateWithFlags(&body_done, cudaEventDisableTiming));

  uint32_t* flag = pin.dev;  // word 0 of pinned host memory
  uint32_t* marker = dev_words + 1;
  pin.host[1] = 7;  // the caller's copy of the marker lands here
  FEPLB_CUDA_CHECK(cudaMemsetAsync(marker, 0, 4, body));
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(body));

  // The caller's thread: the wait and the work after it, then it returns.
  step("caller enqueues");
  stream_wait_u32_geq(caller, flag, v);
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(pin.host + 1, marker, 4, cudaMemcpyDeviceToHost, caller));
  FEPLB_CUDA_CHECK(cudaEventRecord(caller_done, caller));
  // The scheduler's thread, later: the body on its own stream, then the release.
  std::thread scheduler([&] {
    step("scheduler enqueues");
    FEPLB_CUDA_CHECK(kernels::gpu_delay(200'000, body));
    FEPLB_CUDA_CHECK(cudaMemsetAsync(marker, 0xff, 4, body));
    if (c.release == Release::kStreamWrite) stream_write_u32(body, flag, v);
    FEPLB_CUDA_CHECK(cudaEventRecord(body_done, body));
    if (c.release == Release::kHostWrite && wait_event(body_done, stall_ms))
      __atomic_store_n(pin.host, v, __ATOMIC_RELEASE);
  });
  scheduler.join();
  step("caller's event");
  const auto t0 = Clock::now();
  Outcome o;
  o.stalled = !wait_event(caller_done, stall_ms);
  o.release_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (o.stalled) __atomic_store_n(pin.host, v, __ATOMIC_RELEASE);  // break the stall
  step("device synchronize");
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  step("clean up");
  o.early = !o.stalled && pin.host[1] != 0xffffffffu;
  for (auto s : fillers) FEPLB_CUDA_CHECK(cudaStreamDestroy(s));
  FEPLB_CUDA_CHECK(cudaStreamDestroy(body));
  if (c.caller == Caller::kCreated) FEPLB_CUDA_CHECK(cudaStreamDestroy(caller));
  FEPLB_CUDA_CHECK(cudaEventDestroy(caller_done));
  FEPLB_CUDA_CHECK(cudaEventDestroy(body_done));
  g_case_start_ns.store(0);
  return o;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"feplb_handoff_probe: a stream-memory wait released by a later-enqueued stream"};
  std::string out;
  double stall_ms = 300;
  app.add_option("--out", out, "JSON results")->required();
  app.add_option("--stall-ms", stall_ms, "a caller not released by then is a stall");
  bool no_warmup = false;
  app.add_flag("--no-warmup", no_warmup,
               "launch the body's kernel for the first time inside the first case (lazy module "
               "loading while a stream waits)");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  start_watchdog();
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  Pinned pin;
  uint32_t* dev_words = nullptr;
  FEPLB_CUDA_CHECK(cudaMalloc(&dev_words, 64));
  FEPLB_CUDA_CHECK(cudaMemset(dev_words, 0, 64));
  pin.host[0] = 0;
  if (!no_warmup) {  // the body's kernel loaded before any stream waits (CUDA loads lazily)
    FEPLB_CUDA_CHECK(kernels::gpu_delay(1000, nullptr));
    FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  }
  nlohmann::json cases = nlohmann::json::array();
  uint32_t v = 0;
  int stalls = 0, early = 0;
  for (Caller caller : {Caller::kCreated, Caller::kLegacyDefault, Caller::kPerThreadDefault}) {
    for (int fillers : {0, 1, 3, 6, 7, 8, 15, 31, 32}) {
      for (bool high : {false, true}) {
        {
          for (Release rel : {Release::kStreamWrite, Release::kHostWrite}) {
            const Case c{caller, fillers, high, rel};
            const Outcome o = run_case(c, ++v, pin, dev_words, stall_ms);
            stalls += o.stalled;
            early += o.early;
            cases.push_back({{"caller", name(caller)},
                             {"fillers", fillers},
                             {"body_high_priority", high},
                             {"release", rel == Release::kStreamWrite ? "stream-write" : "host"},
                             {"stalled", o.stalled},
                             {"released_early", o.early},
                             {"caller_done_us", o.release_us}});
            std::printf("%-18s fillers %2d high %d release %-12s %s\n", name(caller), fillers, high,
                        rel == Release::kStreamWrite ? "stream-write" : "host",
                        o.stalled ? "STALL" : (o.early ? "EARLY" : "ok"));
          }
        }
      }
    }
  }
  FEPLB_CUDA_CHECK(cudaFree(dev_words));
  cudaDeviceProp prop{};
  FEPLB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  nlohmann::json j = {
      {"device", prop.name},     {"cuda_device_max_connections", conn ? conn : "unset (8)"},
      {"stall_ms", stall_ms},    {"stalls", stalls},
      {"released_early", early}, {"cases", cases}};
  std::ofstream(out) << j.dump(1) << "\n";
  std::printf("connections %s: %d stalls, %d early of %zu cases\n", conn ? conn : "unset", stalls,
              early, cases.size());
  return early > 0 ? 1 : 0;
}

}  // namespace
}  // namespace feplb::cuda

int main(int argc, char** argv) {
  try {
    return feplb::cuda::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb_handoff_probe: %s\n", e.what());
    return 1;
  }
}
