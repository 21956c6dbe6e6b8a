#include "feplb/cuda/transport/stream_ops.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>

#include "feplb/cuda/base/check.h"

namespace feplb::cuda {
namespace {

struct DriverOps {
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuStreamBatchMemOp_v11070 batch = nullptr;
};

void* entry_point(const char* symbol) {
  cudaDriverEntryPointQueryResult q{};
  void* fn = nullptr;
  FEPLB_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &q));
  FEPLB_CHECK(q == cudaDriverEntryPointSuccess && fn, "driver has no {}", symbol);
  return fn;
}

const DriverOps& ops() {
  static DriverOps d;
  static std::once_flag once;
  std::call_once(once, [] {
    d.write =
        reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(entry_point("cuStreamWriteValue32"));
    d.wait = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(entry_point("cuStreamWaitValue32"));
    d.batch = reinterpret_cast<PFN_cuStreamBatchMemOp_v11070>(entry_point("cuStreamBatchMemOp"));
  });
  return d;
}

}  // namespace

void stream_write_u32(cudaStream_t stream, uint32_t* flag, uint32_t value) {
  FEPLB_CU_CHECK(ops().write(reinterpret_cast<CUstream>(stream),
                             reinterpret_cast<CUdeviceptr>(flag), value,
                             CU_STREAM_WRITE_VALUE_DEFAULT));
}

void stream_barrier_write_u32(cudaStream_t stream, uint32_t* flag, uint32_t value) {
  CUstreamBatchMemOpParams p[2] = {};
  p[0].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  p[0].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_SYS;
  p[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  p[1].writeValue.address = reinterpret_cast<CUdeviceptr>(flag);
  p[1].writeValue.value = value;
  p[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  FEPLB_CU_CHECK(ops().batch(reinterpret_cast<CUstream>(stream), 2, p, 0));
}

void stream_wait_u32_geq(cudaStream_t stream, const uint32_t* flag, uint32_t value,
                         bool flush_remote_writes) {
  unsigned flags = CU_STREAM_WAIT_VALUE_GEQ;
  if (flush_remote_writes) flags |= CU_STREAM_WAIT_VALUE_FLUSH;
  FEPLB_CU_CHECK(ops().wait(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag),
                            value, flags));
}

bool can_flush_remote_writes(int device) {
  int v = 0;
  FEPLB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrCanFlushRemoteWrites, device));
  return v != 0;
}

}  // namespace feplb::cuda
