#include "feplb/cuda/transport/ce_copy.h"

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/transport/stream_ops.h"

namespace feplb::cuda {

void ce_copy_and_signal(cudaStream_t stream, std::span<const CeCopy> copies, uint32_t* flag,
                        uint32_t value) {
  for (const CeCopy& c : copies) {
    if (c.bytes)
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream));
  }
  if (flag) stream_write_u32(stream, flag, value);
}

}  // namespace feplb::cuda
