#include "feplb/cuda/base/resources.h"

#include <chrono>
#include <thread>

namespace feplb::cuda {

void sync_with_timeout(cudaStream_t stream, double timeout_s, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int spins = 0;; ++spins) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) FEPLB_CUDA_CHECK(err);
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(
          fmt::format("{}: no progress for {:.0f} s (a peer never answered?)", what, timeout_s));
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void require_uncaptured(cudaStream_t stream, const char* who) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err == cudaErrorStreamCaptureImplicit) {
    cudaGetLastError();  // not sticky: clear it
    status = cudaStreamCaptureStatusActive;
  } else {
    FEPLB_CUDA_CHECK(err);
  }
  FEPLB_REQUIRE_INPUT(status == cudaStreamCaptureStatusNone,
                      "{}: its stream is being captured into a CUDA graph; feplb's calls cannot be "
                      "captured (they wait on the host for the routing counts and the plan): call "
                      "it outside the capture",
                      who);
}

}  // namespace feplb::cuda
