// The scheduler thread's job of a call: counts on the host -> plan -> layout (forward), then the
// phase-2 input copies as a step program (forward and backward; the backward reuses the
// forward's plan).
#include <algorithm>
#include <atomic>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/spin_wait.h"
#include "feplb/cuda/layer/layer_impl.h"

namespace feplb::cuda {
namespace {

double us_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

void MoeLayer::Impl::run_job(void* self) {
  auto* m = static_cast<Impl*>(self);
  try {
    if (!m->job.backward) m->plan_job();
    m->issue_inputs();
  } catch (...) {
    m->rt->calls.error = std::current_exception();
    m->rt->calls.failed.store(true, std::memory_order_release);
  }
}

// Every rank's counts: wait for the D2H copy (polling: this thread exists to react at once).
void MoeLayer::Impl::wait_counts() const {
  const RuntimeState& r = *rt;
  const auto deadline = Clock::now() + std::chrono::duration<double>(r.cfg.timeout_s);
  for (uint64_t spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(r.streams.ev_counts.get());
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) FEPLB_CUDA_CHECK(q);
    if ((spins & 16383) == 16383) r.check_peers("the counts all-gather");
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format(
          "layer '{}' rank {}: counts never reached the host in {:.0f} s (a peer never joined the "
          "all-gather?)",
          cfg.name, r.rank, r.cfg.timeout_s));
    }
    spin_pause(spins);
  }
}

// The routing step from the gathered counts (dispatched rows: each rank's rows per local expert;
// otherwise every rank's rows per expert, and the first rank that sent out-of-range ids), and
// every rank's planner time: the largest is what the next plan's modes are compared at
// (recent_us).
void MoeLayer::Impl::routing_from_counts(MicroBatchState& h) {
  const RuntimeState& r = *rt;
  const int R = r.world;
  const int E = static_cast<int>(r.E);
  if (h.routing.num_ranks != R || h.routing.num_experts != E) h.routing = RoutingStep(0, 0, R, E);
  h.routing.step = static_cast<int>(job.seq);
  h.routing.layer = layer_id;
  job.bad_ids = 0;
  recent_us = 0;
  if (job.dispatched) {
    // Each rank's rows per local expert, then its planner time; planners need every expert's
    // total (at its home).
    std::fill(h.routing.counts.begin(), h.routing.counts.end(), 0);
    const int L = r.experts_per_rank;
    for (int d = 0; d < R; ++d) {
      const int32_t* row = r.arena.counts_host.get() + static_cast<size_t>(d) * (L + 1);
      const auto local = r.cfg.topo.local_experts(d);
      for (int i = 0; i < L; ++i) h.routing.at(d, local[i]) = row[i];
      recent_us = std::max(recent_us, row[L]);
    }
    return;
  }
  for (int d = 0; d < R; ++d) {
    const int32_t* row = r.arena.counts_host.get() + static_cast<size_t>(d) * (E + 2);
    recent_us = std::max(recent_us, row[E + 1]);
    std::copy(row, row + E, h.routing.counts.begin() + static_cast<std::ptrdiff_t>(d) * E);
    if (row[E] > 0 && job.bad_ids == 0) {
      job.bad_ids = row[E];
      job.bad_rank = d;
    }
  }
}

// Weights prefetched for this forward: the plan must list exactly what was copied, in order (the
// layout then gives each pair the slot it was copied into). `hits`: pairs the plan computes with.
void MoeLayer::Impl::check_prefetched(const MicroBatchState& h, int64_t& hits) {
  const std::vector<Copy>& done = rt->calls.pending.copies;
  size_t k = 0;
  bool same = true;
  for (const Copy& c : h.plan.copies) {
    if (c.kind != CopyKind::kPrefetchWeights) continue;
    same = same && k < done.size() && done[k].expert == c.expert && done[k].dst_gpu == c.dst_gpu;
    ++k;
  }
  if (!same || k != done.size()) {
    job.error = fmt::format(
        "planner '{}' of layer '{}' planned other prefetched weights than its prefetch() "
        "predicted ({} copied, {} in the plan)",
        planner->name(), cfg.name, done.size(), k);
  }
  for (const Copy& c : done) {
    for (const Slice& sl : h.plan.slices)
      hits += sl.expert == c.expert && sl.gpu == c.dst_gpu ? 1 : 0;
  }
}

void MoeLayer::Impl::plan_job() {
  RuntimeState& r = *rt;
  MicroBatchState& h = *job.h;
  const uint32_t seq = job.seq;
  // The counts are on their way: meanwhile the planner's code and tables back into the caches
  // (Planner::prime), unless the counts have mostly overtaken the primes lately.
  job.prime_us = 0;
  job.prime_overtaken = false;
  const bool prime = r.cfg.prime_planner && (prime_overtaken < 0.5 || seq % kPrimeRetry == 0);
  if (prime && cudaEventQuery(r.streams.ev_counts.get()) == cudaErrorNotReady) {
    const auto p0 = Clock::now();
    if (planner->prime(layer_id, h.plan)) {
      job.prime_us = us_between(p0, Clock::now());
      job.prime_overtaken = cudaEventQuery(r.streams.ev_counts.get()) != cudaErrorNotReady;
      prime_overtaken = 0.8 * prime_overtaken + (job.prime_overtaken ? 0.2 : 0.0);
    }
  }
  wait_counts();
  const auto t_seen = Clock::now();
  routing_from_counts(h);
  if (job.bad_ids > 0) {
    // Every rank sees the same counts and stops at the same step; nothing is planned or copied.
    job.runs = false;
    r.calls.plan_seq.store(seq, std::memory_order_release);
    return;
  }
  h.routing.sum_experts();
  // RuntimeConfig::measure_planner: the modes are compared at what the layer's plans took lately
  // on the slowest rank's host (the same on every rank: the gathered times).
  if (r.cfg.measure_planner) planner->set_recent_plan_us(recent_us);
  const auto t0 = Clock::now();
  planner->plan(h.routing, h.plan);
  const auto t1 = Clock::now();
  job.planned = true;  // observed after the copies are issued (with prefetch, observe plans again)
  h.layout.build(r.cfg.topo, h.routing, h.plan, r.rank, capacity);
  job.error.clear();
  int64_t hits = 0;
  if (job.prefetched) check_prefetched(h, hits);
  job.runs = h.layout.fits() && job.error.empty();
  job.plan_ready = Clock::now();
  if (job.runs) {
    for (const SlotUse& u : h.layout.slot_uses()) {
      r.pool->holder(u.rank, u.slot) = ExpertSlotPool::tag(layer_id, u.expert, seq);
    }
  }
  h.stats = ForwardStats{};
  h.stats.counts_to_host_us = us_between(forward_timeline.host(Mark::kCountsIssued), t_seen);
  h.stats.plan_us = us_between(t0, t1);
  h.stats.prime_us = job.prime_us;
  h.stats.prime_overtaken = job.prime_overtaken;
  if (r.cfg.measure_planner) {
    std::atomic_ref<int32_t>(*planner_us.get())
        .store(clock.add(h.plan.mode, h.stats.plan_us, h.plan.candidates),
               std::memory_order_relaxed);
  }
  h.stats.plan_reserve_us =
      h.plan.planned_before_dispatch ? 0.0 : h.plan.schedule.copy_start_ms * 1e3;
  h.stats.counts_to_plan_us = us_between(t_seen, job.plan_ready);
  h.stats.exported_rows = h.layout.exported_rows();
  h.stats.guest_rows = h.layout.guest_rows_here();
  for (const GuestWork& g : h.layout.guest_work())
    h.stats.dispatched_rows += g.dispatched ? g.rows : 0;
  h.stats.prefetched_pairs =
      job.prefetched ? static_cast<int64_t>(r.calls.pending.copies.size()) : 0;
  h.stats.prefetch_hits = hits;
  r.calls.plan_seq.store(seq, std::memory_order_release);
}

// Phase-2 inputs, helper by helper (program/build_program.h, build_inputs), then, forward, the
// planner observes the step; the last step publishes HostFlag::kCopiesOut.
void MoeLayer::Impl::issue_inputs() {
  MicroBatchState& h = *job.h;
  InputFacts f;
  f.backward = job.backward;
  f.runs = job.runs;
  f.prefetched_here = job.prefetched;
  f.observe = job.planned;
  f.recopy = job.recopy;
  f.rows = job.rows;
  build_inputs(inputs, h.layout, f, rt->rank);
  Bindings b;
  b.mb = &h;
  b.call = job.seq;
  b.caller_in = job.caller_rows;
  b.experts = experts;
  b.copies = job.backward ? &bstats.copies : &h.stats.copies;
  b.weight_copies = job.backward ? nullptr : &h.stats.weight_copies;
  sched_exec.run(inputs, b, *this);
}

}  // namespace feplb::cuda
