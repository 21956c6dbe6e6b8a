/* feplb C API: the GPU runtime (feplb/cuda/runtime.h, moe_layer.h) behind a C ABI, for bindings
 * that should not compile against C++ or a framework's headers: the Python package's
 * `feplb.torch` loads libfeplb_cuda with ctypes and passes tensors' device pointers and CUDA
 * streams. Pointers to device memory and streams are plain `void*` (a cudaStream_t is one).
 *
 * Every function returning int returns FEPLB_OK, FEPLB_INPUT_ERROR (bad input or misuse; the
 * message names it) or FEPLB_ERROR (a failure of CUDA, NCCL or a peer); feplb_last_error() gives
 * the message of the calling thread's last failure. Nothing here throws or aborts.
 *
 * CUDA graphs: feplb_forward, feplb_backward and feplb_layer_sync_gradients of a one-rank runtime
 * whose forwards count their rows on the GPU (grouped expert GEMMs on an H100 or H200, no call
 * thread) may be captured; a micro-batch's forward and backward are captured both or neither, and
 * each replay's routing counts reach the layer's statistics through a captured host node. Every
 * other call on a stream being captured (several ranks, per-expert GEMMs, the dispatched forms,
 * synchronize) returns FEPLB_INPUT_ERROR ("... being captured into a CUDA graph ...") before
 * enqueueing anything, so the capture stays valid and holds none of it.
 */
#ifndef FEPLB_CUDA_C_API_H_
#define FEPLB_CUDA_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FEPLB_OK = 0, FEPLB_INPUT_ERROR = 1, FEPLB_ERROR = 2 };

/* The message of this thread's last failure ("" when none). */
const char* feplb_last_error(void);

typedef struct feplb_group feplb_group;     /* R virtual ranks of this process on the current GPU */
typedef struct feplb_runtime feplb_runtime; /* one rank's EpRuntime (and its transport) */
typedef struct feplb_layer feplb_layer;     /* one MoE layer of a runtime */

/* Saved activations from the caller's allocator (e.g. a framework's caching allocator). */
typedef struct {
  void* (*allocate)(size_t bytes, void* stream, void* ctx);
  void (*deallocate)(void* ptr, size_t bytes, void* stream, void* ctx);
  void* ctx;
} feplb_allocator;

/* Virtual ranks: an in-process group of `world` ranks (testing on one GPU). */
int feplb_group_create(int world, double timeout_s, feplb_group** out);
void feplb_group_destroy(feplb_group* group);

/* NCCL: a unique id (128 bytes) for rank 0 to share, and a communicator of feplb's own from it
 * (non-blocking init, bounded by timeout_s). The caller owns the communicator. */
int feplb_nccl_unique_id(char out[128]);
int feplb_nccl_comm_init(const char id[128], int world, int rank, int device, double timeout_s,
                         void** comm_out);
int feplb_nccl_comm_destroy(void* comm);

/* A rank's runtime, configured by a JSON object (keys: ranks, gpus_per_node, experts, homes
 * (optional [experts] home ranks), hidden, ffn, max_top_k, max_tokens, knobs ({name: value}),
 * recv_capacity_rows, guest_capacity_rows, staging_slots, max_in_flight, training, timing,
 * timeout_s, name, expert_gemm ("auto", "grouped" or "per_expert": RuntimeConfig::expert_gemm),
 * call_thread ("off", "on" or "auto": RuntimeConfig::call_thread); unknown keys are an input
 * error). Collective over the ranks: every rank
 * creates its runtime with the same configuration. `allocator` may be null (the runtime's own
 * stream-ordered pool); it is copied. In-process: rank `rank` of `group`. NCCL: a borrowed
 * communicator (an ncclComm_t, e.g. a framework's process group's) on CUDA device `device`. */
int feplb_runtime_create_inproc(const char* config_json, feplb_group* group, int rank,
                                const feplb_allocator* allocator, feplb_runtime** out);
int feplb_runtime_create_nccl(const char* config_json, void* nccl_comm, int device,
                              const feplb_allocator* allocator, feplb_runtime** out);
/* Layers may outlive their runtime (their calls then fail with an input error). */
void feplb_runtime_destroy(feplb_runtime* runtime);
/* {"rank", "world_size", "experts_per_rank", "workspace_bytes", "saved_bytes",
 *  "micro_batches_in_flight", "scheduler_cpu_seconds", "expert_gemm" ("grouped",
 *  "per_expert", or "auto": grouped but for batches of large experts), "call_thread" (whether
 *  the layers' calls run on the runtime's call thread)} as JSON into buf
 * (NUL-terminated, at most cap bytes); *len gets the length it needs. */
int feplb_runtime_info_json(feplb_runtime* runtime, char* buf, size_t cap, size_t* len);

/* A layer with a planner by name (static, feplb-paper, feplb, oracle). */
int feplb_layer_create(feplb_runtime* runtime, int top_k, const char* name, const char* policy,
                       feplb_layer** out);
void feplb_layer_destroy(feplb_layer* layer);

typedef struct {
  feplb_layer* layer;
  const void* const* gate_up; /* [num_experts] device pointers, bf16 [H, 2F] each */
  const void* const* down;    /* [num_experts] device pointers, bf16 [F, H] each */
  int num_experts;            /* this rank's experts */
  const void* hidden;         /* [S, H] bf16 */
  const int32_t* topk_idx;    /* [S, K] global expert ids */
  const float* topk_weight;   /* [S, K] */
  int64_t num_tokens;         /* S */
  void* out;                  /* [S, H] bf16 */
  void* stream;
  int64_t handle; /* out: the micro-batch for backward (0: none kept) */
} feplb_forward_args;

/* The weight gradients' dtype in a backward's arguments. */
enum { FEPLB_GRAD_F32 = 0, FEPLB_GRAD_BF16 = 1 };

typedef struct {
  feplb_layer* layer;
  int64_t handle; /* from a forward of this layer; consumed (also on failure after validation) */
  const void* const* gate_up;
  const void* const* down;
  int num_experts;
  const void* grad_out;      /* [S, H] bf16 */
  const float* topk_weight;  /* [S, K] */
  void* grad_hidden;         /* [S, H] bf16 */
  float* grad_topk_weight;   /* [S, K] */
  void* const* grad_gate_up; /* [num_experts] device pointers, [H, 2F] of grad_dtype */
  void* const* grad_down;    /* [num_experts] device pointers, [F, H] of grad_dtype */
  int accumulate;            /* 1: add into the gradients; 0: overwrite them */
  void* stream;
  int grad_dtype; /* FEPLB_GRAD_F32 (0), or FEPLB_GRAD_BF16: the parameters' dtype, written by the
                     dW GEMMs themselves (no fp32 buffer, no cast) */
} feplb_backward_args;

/* n calls, one per rank: n == 1 runs on the calling thread; n > 1 (virtual ranks of one group,
 * each with its own stream) runs them concurrently on n threads and reports the first rank's
 * failure. */
int feplb_forward(int n, feplb_forward_args* args);
int feplb_backward(int n, const feplb_backward_args* args);
/* Rows a framework dispatched itself (MoeLayer::forward_dispatched): rows at this rank's experts,
 * grouped by local expert; phase 2 and the GEMMs only; outputs per row, before any combine. */
typedef struct {
  feplb_layer* layer;
  const void* const* gate_up;
  const void* const* down;
  int num_experts;
  const void* rows;               /* [N, H] bf16 */
  const int64_t* rows_per_expert; /* [num_experts] host values, summing to N */
  void* out_rows;                 /* [N, H] bf16 */
  void* stream;
  int64_t handle; /* out */
} feplb_dispatched_forward_args;

typedef struct {
  feplb_layer* layer;
  int64_t handle;
  const void* const* gate_up;
  const void* const* down;
  int num_experts;
  const void* grad_out_rows; /* [N, H] bf16 */
  void* grad_rows;           /* [N, H] bf16 */
  void* const* grad_gate_up;
  void* const* grad_down;
  int accumulate;
  void* stream;
  int grad_dtype; /* as feplb_backward_args' */
} feplb_dispatched_backward_args;

int feplb_forward_dispatched(int n, feplb_dispatched_forward_args* args);
int feplb_backward_dispatched(int n, const feplb_dispatched_backward_args* args);

/* Gives an unused micro-batch's memory back. Unknown or consumed handles are an input error. */
int feplb_handle_drop(int64_t handle);
/* Later work on `stream` sees every weight gradient the layer's backwards produced. */
int feplb_layer_sync_gradients(feplb_layer* layer, void* stream);
/* The layer's last forward and backward, as JSON: the plan (rows per GPU before and after
 * balancing, experts moved, weight and token bytes), planner and copy latencies, copy waits, and
 * per call ("forward", "backward") "host": where its time on the caller's thread went (call_us,
 * await_us, gemm_us, kernel_us, exchange_us, sync_us, hooks_us, build_us, refine_us, gemms;
 * feplb/cuda/stats.h). GPU
 * times need the stream to have finished. */
int feplb_layer_stats_json(feplb_layer* layer, char* buf, size_t cap, size_t* len);

#ifdef __cplusplus
}
#endif

#endif /* FEPLB_CUDA_C_API_H_ */
