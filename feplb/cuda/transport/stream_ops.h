// SM-free signalling between streams and GPUs: 32-bit stream memory operations (the GPU's front
// end writes or waits on a word in device memory; no kernel, no SM). Resolved from the driver at
// run time, so feplb does not link libcuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace feplb::cuda {

// After all prior work on `stream`: *flag = value (with a memory fence before the write).
void stream_write_u32(cudaStream_t stream, uint32_t* flag, uint32_t value);
// After all prior work on `stream`: a system-scope memory barrier, then *flag = value (one batch
// of two stream memory operations).
void stream_barrier_write_u32(cudaStream_t stream, uint32_t* flag, uint32_t value);
// Work after this on `stream` starts once *flag >= value (treating them as unsigned). With
// `flush_remote_writes` the wait is followed by a flush of remote writes that reached this GPU
// (CU_STREAM_WAIT_VALUE_FLUSH); only where can_flush_remote_writes(device) is true.
void stream_wait_u32_geq(cudaStream_t stream, const uint32_t* flag, uint32_t value,
                         bool flush_remote_writes = false);
// Whether `device` supports CU_STREAM_WAIT_VALUE_FLUSH
// (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES).
bool can_flush_remote_writes(int device);

}  // namespace feplb::cuda
