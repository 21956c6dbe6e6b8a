// RAII owners of CUDA resources (device and pinned memory, streams, events, cuBLAS handles).
// Constructors throw feplb::Error on failure; destructors never throw (they print instead).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "feplb/cuda/base/check.h"

namespace feplb::cuda {

// `count` elements of T in device memory (uninitialised). count == 0 holds no memory.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ == 0) return;
    const cudaError_t err = cudaMalloc(&ptr_, count_ * sizeof(T));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw InputError(fmt::format("out of GPU memory: asked for {:.2f} GiB, {:.2f} GiB free",
                                   static_cast<double>(count_ * sizeof(T)) / (1 << 30),
                                   static_cast<double>(free_b) / (1 << 30)));
    }
    FEPLB_CUDA_CHECK(err);
  }
  ~DeviceBuffer() {
    if (ptr_) FEPLB_CUDA_WARN(cudaFree(ptr_));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Page-locked host memory (for copies the copy engine does, and for counts read by the host).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t count) : count_(count) {
    if (count_) FEPLB_CUDA_CHECK(cudaMallocHost(&ptr_, count_ * sizeof(T)));
  }
  ~PinnedBuffer() {
    if (ptr_) FEPLB_CUDA_WARN(cudaFreeHost(ptr_));
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  T* get() const { return ptr_; }
  size_t size() const { return count_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

class Stream {
 public:
  Stream() { FEPLB_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) FEPLB_CUDA_WARN(cudaStreamDestroy(s_));
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = false) {
    FEPLB_CUDA_CHECK(
        cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (e_) FEPLB_CUDA_WARN(cudaEventDestroy(e_));
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) const { FEPLB_CUDA_CHECK(cudaEventRecord(e_, s)); }

 private:
  cudaEvent_t e_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle() { FEPLB_CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() {
    if (h_) cublasDestroy(h_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// Milliseconds between two recorded timing events.
inline float elapsed_ms(const Event& a, const Event& b) {
  float ms = 0;
  FEPLB_CUDA_CHECK(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return ms;
}

// Waits for `stream` at most `timeout_s` seconds; throws Error naming `what` on timeout, so a peer
// that never answers (a stream waiting on a flag nobody writes) becomes an error, not a hang.
void sync_with_timeout(cudaStream_t stream, double timeout_s, const char* what);

// The id of the CUDA graph capture `stream` is part of, 0 where it is not being captured.
// InputError naming `who` for the legacy default stream while another stream captures (no work
// may go there then) and for a capture an earlier error invalidated.
unsigned long long capture_id(cudaStream_t stream, const char* who);

// Throws InputError naming `who` when `stream` is being captured into a CUDA graph: every call but
// a one-rank runtime's forward and backward waits on the host for routing counts or a plan, which
// a capture cannot hold, and no part of it is captured.
void require_uncaptured(cudaStream_t stream, const char* who);

}  // namespace feplb::cuda
