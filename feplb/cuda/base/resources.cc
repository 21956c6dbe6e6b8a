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

unsigned long long capture_id(cudaStream_t stream, const char* who) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, &id);
  if (err == cudaErrorStreamCaptureImplicit) {
    cudaGetLastError();  // not sticky: clear it
    throw InputError(fmt::format(
        "{}: called on the legacy default stream while another stream is being captured into a "
        "CUDA graph; call it on the capturing stream or outside the capture",
        who));
  }
  FEPLB_CUDA_CHECK(err);
  FEPLB_REQUIRE_INPUT(status != cudaStreamCaptureStatusInvalidated,
                      "{}: its stream's CUDA graph capture was invalidated by an earlier error",
                      who);
  return status == cudaStreamCaptureStatusActive ? id : 0;
}

void require_uncaptured(cudaStream_t stream, const char* who) {
  FEPLB_REQUIRE_INPUT(capture_id(stream, who) == 0,
                      "{}: its stream is being captured into a CUDA graph; only a one-rank "
                      "runtime's forward and backward can be captured (the other calls wait on "
                      "the host for routing counts or plans): call it outside the capture",
                      who);
}

}  // namespace feplb::cuda
