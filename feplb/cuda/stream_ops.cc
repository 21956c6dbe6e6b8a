#include "feplb/cuda/stream_ops.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>

#include "feplb/cuda/check.h"

namespace feplb::cuda {
namespace {

struct DriverOps {
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
};

const DriverOps& ops() {
  static DriverOps d;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    FEPLB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &q));
    FEPLB_CHECK(q == cudaDriverEntryPointSuccess && fn, "driver has no cuStreamWriteValue32");
    d.write = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(fn);
    FEPLB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q));
    FEPLB_CHECK(q == cudaDriverEntryPointSuccess && fn, "driver has no cuStreamWaitValue32");
    d.wait = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(fn);
  });
  return d;
}

}  // namespace

void stream_write_u32(cudaStream_t stream, uint32_t* flag, uint32_t value) {
  FEPLB_CU_CHECK(ops().write(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                             CU_STREAM_WRITE_VALUE_DEFAULT));
}

void stream_wait_u32_geq(cudaStream_t stream, const uint32_t* flag, uint32_t value) {
  FEPLB_CU_CHECK(ops().wait(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                            CU_STREAM_WAIT_VALUE_GEQ));
}

}  // namespace feplb::cuda
