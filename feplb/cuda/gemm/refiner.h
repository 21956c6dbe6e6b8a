// GemmRefiner: chooses exact cuBLASLt algorithms for the GEMM shapes engines met for the first
// time, on a background thread of its own (its own cuBLASLt handle and descriptors), into the
// process-wide table every GemmEngine reads (gemm.h). A heuristic query costs 100-300 us of host
// time and new expert row counts appear every micro-batch: asked on the caller's thread they were
// GPU time wherever the host paces the GPU (small experts), and on the scheduler's thread they
// would be plan latency. Until a shape's exact algorithm arrives its bucket's runs. Idle, the
// thread sleeps on a condition variable.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "feplb/cuda/gemm/gemm.h"

namespace feplb::cuda {

class GemmRefiner {
 public:
  GemmRefiner();   // on the current device
  ~GemmRefiner();  // drops what is still queued, finishes the query in progress, joins
  GemmRefiner(const GemmRefiner&) = delete;
  GemmRefiner& operator=(const GemmRefiner&) = delete;

  // Takes `engine`'s queued shapes (microseconds: a lock and a copy); the thread refines them.
  void take(GemmEngine& engine);
  // Waits until every shape taken so far is refined (tests, benchmarks).
  void drain();
  // Shapes this refiner asked the heuristic for.
  int64_t queries() const;

 private:
  void loop();

  GemmEngine engine_{/*workspace=*/false};  // used by the thread only
  int device_ = 0;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::vector<GemmEngine::Shape> queue_;
  bool busy_ = false, stop_ = false;
  int64_t queries_ = 0;
  std::string error_;   // the thread's failure, rethrown by take() and drain()
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace feplb::cuda
