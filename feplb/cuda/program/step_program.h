// StepProgram: what one call of the GPU layer (forward, backward, their dispatched-rows forms,
// prefetch) does, as data: per host thread (the caller's, the rank's scheduler), an ordered list
// of typed steps, each on one of the rank's streams: exchanges (all-to-all-v, all-gathers),
// GEMM batches, copy-engine batches, signals and waits (named families, host/signals.h),
// stream events, host hand-offs between the two threads, kernels and timeline marks. Buffers are
// named (Buf) with a row, slot or expert index; the executor (program/executor.h) resolves them
// to the current micro-batch's and the runtime's pointers when it runs the steps. Plain host code
// (no CUDA type), built from a StepLayout by program/build_program.h and printed by dump(), so
// CPU tests show what a call does (tests/cpu/golden/).
//
// Order: the executor issues a thread's steps in list order. Within a stream that is the GPU's
// order; across streams, an event wait orders against the record issued before it on the host,
// so the list order across streams matters too and is kept as the layer always issued it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/cuda/host/signals.h"

namespace feplb::cuda {

// The rank's streams: the caller's, the phase-2 inputs' copy stream (and prefetches), the
// results' copy stream.
enum class StreamId : uint8_t { kCompute, kCopyIn, kCopyOut };

// Named buffers. Rows of H bf16 unless said otherwise; `index` is a row for row buffers, a slot
// for slot buffers, a local expert for the caller's weights and gradients.
enum class Buf : uint8_t {
  kNone,
  // The runtime's, one call at a time.
  kSend,         // [max_pairs] X (forward) or dY (backward) in send order
  kBack,         // [max_pairs] backward: dX back in send order
  kDyHome,       // [recv] backward: dY at the experts' homes
  kResultsHome,  // [recv] Y (forward) or dX (backward) at home; helpers write into it
  kGuestIn,      // [guest] guests' X or dY; owners write into it
  kGuestOut,     // [guest] guests' Y or dX
  // The micro-batch's (saved for the backward).
  kXHome,   // [recv] rows at home (forward_dispatched: the caller's rows)
  kGuestX,  // [guest] guests' X kept for the backward, else kGuestIn (forward-only runtimes)
  kXGuest,  // [guest] guests' X kept for the backward
  kYSend,   // [S K] outputs in send order
  // The caller's, per call.
  kCallerIn,   // rows in: forward_dispatched's rows, backward_dispatched's dY rows
  kCallerOut,  // rows out: forward_dispatched's outputs, backward_dispatched's dX rows
  kWeights,    // the caller's weights of local expert `index` (gate|up, then down)
  kGrads,      // the caller's fp32 gradients of local expert `index`
  // Slots (ExpertSlotPool): index = slot.
  kGuestSlot,        // this rank's guest weight slot
  kGradSlot,         // this rank's guest weight-gradient slot (fp32)
  kStagingSlot,      // this rank's gradient staging slot (fp32)
  kPeerGuestSlot,    // `rank`'s guest weight slot
  kPeerStagingSlot,  // `rank`'s gradient staging slot
  // Peers' arenas: index = row.
  kPeerGuestIn,
  kPeerResultsHome,
};
std::string_view buf_name(Buf buf);

// A place in a named buffer: `rank` for peers' buffers (-1: this rank's).
struct Ref {
  Buf buf = Buf::kNone;
  int rank = -1;
  int64_t index = 0;
};

// One copy of a batch: `rows` rows between row buffers; between slot and weight buffers a whole
// expert (rows 0): its weights (two copies: gate|up, down) or its fp32 weight gradient (one).
struct CopyItem {
  Ref dst, src;
  int64_t rows = 0;
};

// One expert FFN (forward or backward) over `rows` rows: inputs `x` (dY: `dy`), outputs `y`
// (dX), weights `w` (the caller's local expert or a guest slot), gradients `g` (the caller's
// local expert, or a guest gradient slot), gate|up and activation at row `act_row` of the
// home or guest saved activations.
struct GemmItem {
  int expert = 0;
  int64_t rows = 0;
  Ref x, dy, y, w, g;
  int64_t act_row = 0;
  bool guest = false;  // saved activations: the guests' (else the home rows')
  float beta = 1.0f;   // backward: gradient accumulation into g
};

// One chunk of an all-to-all-v: `rows` rows to or from `peer` at `at`.
struct ExchangeItem {
  int peer = 0;
  Ref at;
  int64_t rows = 0;
};

// Stream events of the runtime (and of the layer: kGradsDone) that order one stream after work
// on another, or one call after the previous one.
enum class EventId : uint8_t {
  kCounts,         // the counts reached the host (D2H done)
  kDispatched,     // phase-1 rows in place at home
  kCopyInDone,     // the phase-2 inputs' copies of the call
  kGuestReady,     // every guest's inputs landed
  kGuestDone,      // the guests' GEMMs done
  kCopyOutDone,    // the results' copies of the call
  kCallDone,       // the runtime's previous call
  kPrefetchReady,  // the stream's work before a prefetch's copies
  kPrefetchDone,   // the pending prefetch's copies
  kStagingFree,    // the owner's staging slots read (its dW added)
  kGradsFree,      // the guest gradient slots read (sent back)
  kGradsDone,      // the layer's helpers' dW added into the caller's gradient
};
std::string_view event_name(EventId event);

// Host hand-offs between the caller's thread and the scheduler's, per call.
enum class HostFlag : uint8_t {
  kPlanned,     // scheduler -> caller: the plan, layout and their checks are done
  kDispatched,  // caller -> scheduler: phase 1 is posted, kDispatched recorded
  kCopiesOut,   // scheduler -> caller: the phase-2 input copies are issued, kCopyInDone recorded
};
// Host work of the layer at a point of the caller's steps (the executor calls the layer back).
enum class HostAction : uint8_t {
  kCarveTokens,     // forward: the micro-batch's per-token memory (stream-ordered allocation)
  kStageCounts,     // forward_dispatched: this rank's rows per local expert into pinned memory
  kStartJob,        // hand the call to the scheduler thread (plan and/or phase-2 input copies)
  kDropPrefetch,    // the pending prefetch is settled: forget it (host)
  kStartPrefetch,   // prefetch: number the call, record its copies as the pending prefetch
  kObserve,         // scheduler: the planner observes the planned step
  kStageRowCounts,  // one-rank forward: the rows per expert D2H into the layer's pinned ring, an
                    // event after (the layer reads them at a later call: nothing waits now)
};
std::string_view host_action_name(HostAction action);
std::string_view host_flag_name(HostFlag flag);

// Marks of the call's timeline (executor's Timeline, with the runtime's `timing`).
enum class Mark : uint8_t {
  kStart,
  kCounts,        // the counts all-gather done (GPU)
  kCountsIssued,  // the counts' D2H issued (host clock only)
  kFirstCopy,     // the first phase-2 copy is issued (host clock, and the copy stream)
  kDispatched,
  kStatic,
  kWaited,
  kGuest,
  kReturned,
  kEnd,
};
inline constexpr int kMarks = 10;
std::string_view mark_name(Mark mark);

// The value a signal carries or a wait waits for.
enum class Value : uint8_t {
  kCall,      // this call's number
  kQuiet,     // slots_quiet's current value of the waited-for / signalling rank
  kPrefetch,  // the pending prefetch's call number
};

enum class KernelId : uint8_t {
  kZeroCounts,        // counts = 0
  kCountExperts,      // topk_idx -> counts [E + 1]
  kPlannerTime,       // the layer's recent planner time (pinned host) -> counts[E + 1] (H2D)
  kSendOffsets,       // counts -> offsets in send order
  kScatterRows,       // hidden -> send, pair_pos
  kScatterGrad,       // grad_out -> send (dY), d topk_weight
  kCombine,           // y_send -> out (weighted)
  kCombineGrad,       // back -> grad_hidden (unweighted)
  kZeroGrads,         // a = 0: one expert's gradients no home dW GEMM writes (kOverwrite)
  kAddStagedGrad,     // the caller's gradient of local expert a.index += staging slot b.index
  kCountsFromCaller,  // rows per local expert, then the planner time (host) -> counts (H2D)
  kCountsToHost,      // counts_all -> counts_host (D2H)
  kSyncCounts,        // the host waits for the stream (sync_before_counts)
};
std::string_view kernel_name(KernelId kernel);

enum class Op : uint8_t {
  kKernel,         // kernel
  kAllGather,      // count ints of every rank (counts: E + 2; dispatched rows: L + 1; ordering: 1)
  kExchange,       // all-to-all-v: sends [begin, mid), recvs [mid, end) of exchanges
  kGemm,           // forward or backward FFNs [begin, end) of gemms
  kCountedGemm,    // forward or backward FFNs of every local expert over the micro-batch's rows in
                   // expert order, each expert's rows read by the GPU (the micro-batch's
                   // expert_rows, expert_row0): a = input rows (backward: dY), b = output rows
  kCopyBatch,      // copy-engine batch [begin, end) of copies (ce_copy_and_signal, no flag)
  kMemcpy,         // cudaMemcpyAsync of each of [begin, end) of copies
  kKeepGuestRows,  // memcpy [begin, end) of copies, only when the micro-batch keeps guest rows
  kSignal,         // family's signal to `peer` with `value`
  kWait,           // wait for family's signal from `peer` reaching `value`
  kBumpQuiet,      // slots_quiet's value of `peer` += 1 (host)
  kRecord,         // record `event` on the stream
  kWaitEvent,      // the stream waits for `event`
  kPost,           // host: publish `flag` for this call
  kAwait,          // host: wait (bounded) for the other thread's `flag` of this call
  kMark,           // timeline mark
  kHost,           // the layer's host work `action`
};

struct Step {
  Op op = Op::kKernel;
  StreamId stream = StreamId::kCompute;
  KernelId kernel = KernelId::kZeroCounts;
  SignalFamily family = SignalFamily::kInputsLanded;
  Value value = Value::kCall;
  EventId event = EventId::kCounts;
  HostFlag flag = HostFlag::kPlanned;
  Mark mark = Mark::kStart;
  HostAction action = HostAction::kStartJob;
  bool backward = false;   // kGemm: FFN backward; kMark: the backward's timeline
  bool timed = false;      // kWait: a donor wait (the timeline marks before and after)
  bool overwrite = false;  // kCountedGemm backward: dW written (beta 0), else added
  int peer = -1;           // kSignal, kWait, kBumpQuiet
  int64_t count = 0;       // kAllGather: ints per rank
  Ref a, b;                // kKernel kAddStagedGrad: a = grads, b = staging slot
  uint32_t begin = 0, mid = 0, end = 0;
};

// One thread's steps of a call and the items they refer to. clear() keeps the capacity: a warm
// layer builds its programs without allocating.
struct StepList {
  std::vector<Step> steps;
  std::vector<CopyItem> copies;
  std::vector<GemmItem> gemms;
  std::vector<ExchangeItem> exchanges;
  void clear();
};

// A call: what the caller's thread issues, and what the rank's scheduler thread issues (phase-2
// input copies; forward: after planning).
struct StepProgram {
  std::string name;  // "forward", "backward", ...
  int rank = 0;
  StepList caller;
  StepList scheduler;
  void clear();
};

// Human-readable text of a program, one step per line (its items indented below it), grouped by
// thread (golden CPU tests); of one thread's list alone.
std::string dump(const StepProgram& program);
std::string dump(const StepList& list);

}  // namespace feplb::cuda
