#include "feplb/cuda/gemm/refiner.h"

#include "feplb/core/error.h"
#include "feplb/cuda/base/check.h"

namespace feplb::cuda {

GemmRefiner::GemmRefiner() {
  FEPLB_CUDA_CHECK(cudaGetDevice(&device_));
  thread_ = std::thread([this] { loop(); });
}

GemmRefiner::~GemmRefiner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  wake_.notify_one();
  thread_.join();
}

void GemmRefiner::take(GemmEngine& engine) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw Error("GEMM refiner thread: " + error_);
    const size_t before = queue_.size();
    engine.take_pending(queue_);
    wake = queue_.size() > before;
  }
  if (wake) wake_.notify_one();
}

void GemmRefiner::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return (queue_.empty() && !busy_) || !error_.empty(); });
  if (!error_.empty()) throw Error("GEMM refiner thread: " + error_);
}

int64_t GemmRefiner::queries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queries_;
}

void GemmRefiner::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  try {
    FEPLB_CUDA_CHECK(cudaSetDevice(device_));
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const GemmEngine::Shape shape = queue_.back();
      queue_.pop_back();
      busy_ = true;
      lock.unlock();
      const bool asked = engine_.refine_shape(shape);
      lock.lock();
      busy_ = false;
      queries_ += asked ? 1 : 0;
      if (queue_.empty()) idle_.notify_all();
    }
  } catch (const std::exception& e) {
    if (!lock.owns_lock()) lock.lock();
    busy_ = false;
    error_ = e.what();
    queue_.clear();
    idle_.notify_all();
  }
}

}  // namespace feplb::cuda
