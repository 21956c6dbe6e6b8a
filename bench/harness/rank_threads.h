// Running R virtual ranks, one host thread each: the first rank to fail holds the cause (the
// others then fail waiting for it), so that is the error the caller sees.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace feplb::cuda {

// Runs body(rank) for rank = 0..R-1 on R threads, joins them, and rethrows the first failure.
inline void run_rank_threads(int num_ranks, const std::function<void(int)>& body) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < num_ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace feplb::cuda
