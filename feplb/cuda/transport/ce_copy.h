// The phase-2 data path in one place: copy-engine copies followed by a flag write, and the
// matching wait. The layer issues exactly these calls, and tests/gpu/sm_free_test.cc proves on
// every run that they complete while every SM is held by another kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace feplb::cuda {

struct CeCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// On `stream`: each copy (cudaMemcpyAsync, device to device: a copy engine), then *flag = value.
// `flag` may be null (no signal).
void ce_copy_and_signal(cudaStream_t stream, std::span<const CeCopy> copies, uint32_t* flag,
                        uint32_t value);

}  // namespace feplb::cuda
