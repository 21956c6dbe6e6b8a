// feplb's GPU runtime in one header (feplb::cuda; CUDA runtime types, no fmt, no cuBLAS, no NCCL
// header): the per-rank EpRuntime, MoE layers whose forward returns a MicroBatch handle that
// backward consumes, the transports (R virtual ranks in one process, or NCCL), the communicator
// bootstrap (a borrowed ncclComm_t, a caller's all-gather, or the launch environment), and the
// visible GPUs. The planning API (feplb/planning.h) comes with it. Lifecycle: docs/gpu.md.
#pragma once

#include "feplb/cuda/device.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/runtime.h"
#include "feplb/cuda/transport.h"
#include "feplb/dist/launch.h"
#include "feplb/planning.h"
