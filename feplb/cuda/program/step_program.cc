#include "feplb/cuda/program/step_program.h"

#include <fmt/format.h>

namespace feplb::cuda {

std::string_view buf_name(Buf buf) {
  switch (buf) {
    case Buf::kNone:
      return "-";
    case Buf::kSend:
      return "send";
    case Buf::kBack:
      return "back";
    case Buf::kDyHome:
      return "dy_home";
    case Buf::kResultsHome:
      return "results_home";
    case Buf::kGuestIn:
      return "guest_in";
    case Buf::kGuestOut:
      return "guest_out";
    case Buf::kXHome:
      return "x_home";
    case Buf::kGuestX:
      return "guest_x";
    case Buf::kXGuest:
      return "x_guest";
    case Buf::kYSend:
      return "y_send";
    case Buf::kCallerIn:
      return "caller_in";
    case Buf::kCallerOut:
      return "caller_out";
    case Buf::kWeights:
      return "weights";
    case Buf::kGrads:
      return "grads";
    case Buf::kGuestSlot:
      return "guest_slot";
    case Buf::kGradSlot:
      return "grad_slot";
    case Buf::kStagingSlot:
      return "staging_slot";
    case Buf::kPeerGuestSlot:
      return "peer_guest_slot";
    case Buf::kPeerStagingSlot:
      return "peer_staging_slot";
    case Buf::kPeerGuestIn:
      return "peer_guest_in";
    case Buf::kPeerResultsHome:
      return "peer_results_home";
  }
  return "?";
}

std::string_view event_name(EventId event) {
  switch (event) {
    case EventId::kCounts:
      return "counts";
    case EventId::kDispatched:
      return "dispatched";
    case EventId::kCopyInDone:
      return "copy_in_done";
    case EventId::kGuestReady:
      return "guest_ready";
    case EventId::kGuestDone:
      return "guest_done";
    case EventId::kCopyOutDone:
      return "copy_out_done";
    case EventId::kCallDone:
      return "call_done";
    case EventId::kPrefetchReady:
      return "prefetch_ready";
    case EventId::kPrefetchDone:
      return "prefetch_done";
    case EventId::kStagingFree:
      return "staging_free";
    case EventId::kGradsFree:
      return "grads_free";
    case EventId::kGradsDone:
      return "grads_done";
  }
  return "?";
}

std::string_view host_flag_name(HostFlag flag) {
  switch (flag) {
    case HostFlag::kPlanned:
      return "planned";
    case HostFlag::kDispatched:
      return "dispatched";
    case HostFlag::kCopiesOut:
      return "copies_out";
  }
  return "?";
}

std::string_view host_action_name(HostAction action) {
  switch (action) {
    case HostAction::kCarveTokens:
      return "carve_tokens";
    case HostAction::kStageCounts:
      return "stage_counts";
    case HostAction::kStartJob:
      return "start_job";
    case HostAction::kDropPrefetch:
      return "drop_prefetch";
    case HostAction::kStartPrefetch:
      return "start_prefetch";
    case HostAction::kObserve:
      return "observe";
    case HostAction::kStageRowCounts:
      return "stage_row_counts";
  }
  return "?";
}

std::string_view mark_name(Mark mark) {
  switch (mark) {
    case Mark::kStart:
      return "start";
    case Mark::kCounts:
      return "counts";
    case Mark::kCountsIssued:
      return "counts_issued";
    case Mark::kFirstCopy:
      return "first_copy";
    case Mark::kDispatched:
      return "dispatched";
    case Mark::kStatic:
      return "static";
    case Mark::kWaited:
      return "waited";
    case Mark::kGuest:
      return "guest";
    case Mark::kReturned:
      return "returned";
    case Mark::kEnd:
      return "end";
  }
  return "?";
}

std::string_view kernel_name(KernelId kernel) {
  switch (kernel) {
    case KernelId::kZeroCounts:
      return "zero_counts";
    case KernelId::kCountExperts:
      return "count_experts";
    case KernelId::kPlannerTime:
      return "planner_time";
    case KernelId::kSendOffsets:
      return "send_offsets";
    case KernelId::kScatterRows:
      return "scatter_rows";
    case KernelId::kScatterGrad:
      return "scatter_grad";
    case KernelId::kCombine:
      return "combine";
    case KernelId::kCombineGrad:
      return "combine_grad";
    case KernelId::kZeroGrads:
      return "zero_grads";
    case KernelId::kAddStagedGrad:
      return "add_staged_grad";
    case KernelId::kCountsFromCaller:
      return "counts_from_caller";
    case KernelId::kCountsToHost:
      return "counts_to_host";
    case KernelId::kSyncCounts:
      return "sync_counts";
  }
  return "?";
}

void StepList::clear() {
  steps.clear();
  copies.clear();
  gemms.clear();
  exchanges.clear();
}

void StepProgram::clear() {
  caller.clear();
  scheduler.clear();
}

namespace {

std::string_view stream_name(StreamId s) {
  switch (s) {
    case StreamId::kCompute:
      return "compute";
    case StreamId::kCopyIn:
      return "copy_in";
    case StreamId::kCopyOut:
      return "copy_out";
  }
  return "?";
}

std::string_view value_name(Value v) {
  switch (v) {
    case Value::kCall:
      return "call";
    case Value::kQuiet:
      return "quiet";
    case Value::kPrefetch:
      return "prefetch";
  }
  return "?";
}

std::string ref(const Ref& r) {
  if (r.rank >= 0) return fmt::format("{}[r{}][{}]", buf_name(r.buf), r.rank, r.index);
  return fmt::format("{}[{}]", buf_name(r.buf), r.index);
}

std::string copy_text(const CopyItem& c) {
  if (c.src.buf == Buf::kWeights) return fmt::format("{} <- {} (weights)", ref(c.dst), ref(c.src));
  if (c.src.buf == Buf::kGradSlot) return fmt::format("{} <- {} (dW)", ref(c.dst), ref(c.src));
  return fmt::format("{} <- {} x{}", ref(c.dst), ref(c.src), c.rows);
}

std::string gemm_text(const GemmItem& g, bool backward) {
  if (!backward) {
    return fmt::format("e{} x{}: {} -> {} w {}", g.expert, g.rows, ref(g.x), ref(g.y), ref(g.w));
  }
  return fmt::format("e{} x{}: x {} dy {} -> dx {} w {} dW {}{}", g.expert, g.rows, ref(g.x),
                     ref(g.dy), ref(g.y), ref(g.w), ref(g.g), g.beta == 0.0f ? " (=)" : " (+=)");
}

std::string step_head(const Step& s) {
  switch (s.op) {
    case Op::kKernel:
      if (s.kernel == KernelId::kZeroGrads)
        return fmt::format("kernel {} {}", kernel_name(s.kernel), ref(s.a));
      if (s.kernel == KernelId::kAddStagedGrad)
        return fmt::format("kernel {} {} += {}", kernel_name(s.kernel), ref(s.a), ref(s.b));
      if (s.count) return fmt::format("kernel {} ({} ints)", kernel_name(s.kernel), s.count);
      return fmt::format("kernel {}", kernel_name(s.kernel));
    case Op::kAllGather:
      return fmt::format("all-gather {} ints per rank", s.count);
    case Op::kExchange:
      return fmt::format("exchange {} ({} sends, {} recvs)", s.backward ? "reverse" : "dispatch",
                         s.mid - s.begin, s.end - s.mid);
    case Op::kGemm:
      return fmt::format("gemm {} ({} experts)", s.backward ? "backward" : "forward",
                         s.end - s.begin);
    case Op::kCountedGemm:
      return fmt::format("gemm {} (every local expert, rows counted on the GPU): {} -> {}{}",
                         s.backward ? "backward" : "forward", ref(s.a), ref(s.b),
                         s.backward ? (s.overwrite ? " dW (=)" : " dW (+=)") : "");
    case Op::kCopyBatch:
      return fmt::format("copy-engine batch ({} items)", s.end - s.begin);
    case Op::kMemcpy:
      return fmt::format("memcpy ({} items)", s.end - s.begin);
    case Op::kKeepGuestRows:
      return fmt::format("keep guest rows (if kept): wait-event guest_ready, memcpy ({} items)",
                         s.end - s.begin);
    case Op::kSignal:
      return fmt::format("signal {} -> r{} = {}", signal_family_name(s.family), s.peer,
                         value_name(s.value));
    case Op::kWait:
      return fmt::format("wait {} from r{} = {}{}", signal_family_name(s.family), s.peer,
                         value_name(s.value), s.timed ? " (timed)" : "");
    case Op::kBumpQuiet:
      return fmt::format("host quiet[r{}] += 1", s.peer);
    case Op::kRecord:
      return fmt::format("record {}", event_name(s.event));
    case Op::kWaitEvent:
      return fmt::format("wait-event {}", event_name(s.event));
    case Op::kPost:
      return fmt::format("host post {}", host_flag_name(s.flag));
    case Op::kAwait:
      return fmt::format("host await {}", host_flag_name(s.flag));
    case Op::kMark:
      return fmt::format("mark {}{}", s.backward ? "backward." : "forward.", mark_name(s.mark));
    case Op::kHost:
      return fmt::format("host {}", host_action_name(s.action));
  }
  return "?";
}

void dump_list(std::string& out, const StepList& list) {
  for (const Step& s : list.steps) {
    out += fmt::format("  {:<8} {}\n", stream_name(s.stream), step_head(s));
    switch (s.op) {
      case Op::kExchange:
        for (uint32_t i = s.begin; i < s.end; ++i) {
          const ExchangeItem& x = list.exchanges[i];
          out += fmt::format("             {} r{} {} x{}\n", i < s.mid ? "send" : "recv", x.peer,
                             ref(x.at), x.rows);
        }
        break;
      case Op::kGemm:
        for (uint32_t i = s.begin; i < s.end; ++i)
          out += fmt::format("             {}\n", gemm_text(list.gemms[i], s.backward));
        break;
      case Op::kCopyBatch:
      case Op::kMemcpy:
      case Op::kKeepGuestRows:
        for (uint32_t i = s.begin; i < s.end; ++i)
          out += fmt::format("             {}\n", copy_text(list.copies[i]));
        break;
      default:
        break;
    }
  }
}

}  // namespace

std::string dump(const StepList& list) {
  std::string out;
  dump_list(out, list);
  return out;
}

std::string dump(const StepProgram& program) {
  std::string out = fmt::format("{}, rank {}\ncaller thread:\n", program.name, program.rank);
  dump_list(out, program.caller);
  if (!program.scheduler.steps.empty()) {
    out += "scheduler thread:\n";
    dump_list(out, program.scheduler);
  }
  return out;
}

}  // namespace feplb::cuda
