#include "feplb/core/planners/feplb/spill.h"

#include <algorithm>

#include "feplb/core/planners/feplb/bisect.h"
#include "feplb/core/planners/feplb/copy_rules.h"

namespace feplb::feplb_detail {
namespace {

// Receivers from the tree that get no slice (their copy cannot land in time after all) before an
// expert gives up on further helpers.
constexpr int kMaxMisses = 8;

}  // namespace

void Spill::start(const FeplbConfig& mode) {
  const size_t R = static_cast<size_t>(ctx_.topo.num_ranks());
  mode_ = &mode;
  excluded_.assign(R, 0);
  next_candidate_.resize(R);
  rest_.resize(R);
  leaf_of_.resize(R);
}

template <typename Rule>
void Spill::balance_domain(Rule& rule, int dom, int64_t target, int64_t tol, Plan& out) {
  const Topology& topo = ctx_.topo;
  const std::vector<int64_t>& c = *loads_.counts;
  const int first = topo.first_gpu_of_domain(dom), n = topo.domain_size();
  const int64_t cap = target + tol;
  loads_.set_domain(topo, dom, cap);
  donors_.clear();
  tree_.reset(n, Rule::kTreeTiming >= 2);
  for (int i = 0; i < n; ++i) {
    const int g = first + i;
    if (loads_.over(g)) donors_.push_back(g);
    leaf_of_[g] = i;
    tree_.put(i, g, eligible(rule, g), leaf(rule, g));
  }
  tree_.build();
  // Donors take turns, one candidate each, the most loaded first: several hot GPUs then share
  // the receivers' ingress links instead of the first one filling them all.
  for (int d : donors_) {
    next_candidate_[d] = candidates_.begin(d);
    rest_[d] = 0;  // load of d's candidates not offered yet
    for (int i = candidates_.begin(d); i < candidates_.end(d); ++i) {
      rest_[d] += loads_.measure.units(c[candidates_.at(i)]);
    }
  }
  const auto later = [&](int a, int b) {  // heap order: the most loaded, then the lowest GPU
    return loads_.load[a] != loads_.load[b] ? loads_.load[a] < loads_.load[b] : a > b;
  };
  std::make_heap(donors_.begin(), donors_.end(), later);
  while (!donors_.empty()) {
    std::pop_heap(donors_.begin(), donors_.end(), later);
    const int d = donors_.back();
    donors_.pop_back();
    if (!loads_.over(d) || next_candidate_[d] == candidates_.end(d)) {
      if (eligible(rule, d)) refresh(rule, d);  // a donor brought below the cap may receive
      continue;
    }
    const int e = candidates_.at(next_candidate_[d]++);
    rest_[d] -= loads_.measure.units(c[e]);
    spill_expert(rule, e, d, target, cap, tol, rest_[d], out);
    donors_.push_back(d);
    std::push_heap(donors_.begin(), donors_.end(), later);
  }
}

template <typename Rule>
void Spill::spill_expert(Rule& rule, int e, int d, int64_t target, int64_t cap, int64_t tol,
                         int64_t rest, Plan& out) {
  const size_t held = offer_prefetched(e, d);
  int allowed = helpers_allowed(e, d, target);
  int64_t level = target;
  if (loads_.measure.units(loads_.remaining(e)) + rest < loads_.load[d] - target) {
    // d cannot reach the target: level it with e's helpers, gathered first.
    gather_out_ms_ = copies_.links.out_ms(d);
    gather_rows_ = std::min(loads_.remaining(e), loads_.shed_rows(e, d, target));
    while (static_cast<int>(receivers_.size()) < allowed &&
           next_receiver(rule, e, d, target, tol, true)) {
    }
    const int num = static_cast<int>(std::min<size_t>(receivers_.size(), allowed));
    level = helper_level(e, d, num, target, rest);
  }
  // An even share of what d sheds over its allowed helpers: a helper with room for less (filled
  // by earlier donors) does not count against the limit, like one whose window took less.
  const int64_t share =
      (std::min(loads_.remaining(e), loads_.shed_rows(e, d, target)) + allowed - 1) /
      std::max(allowed, 1);
  const int others = ctx_.topo.domain_size() - 1;
  int helpers = 0, misses = 0;
  for (size_t i = 0; helpers < allowed && misses < kMaxMisses; ++i) {
    if (!loads_.over(d) || loads_.remaining(e) == 0) break;
    if (i == receivers_.size() && !next_receiver(rule, e, d, target, tol, false)) break;
    const int h = receivers_[i];
    int64_t rows = slice_for(e, d, h, level - loads_.load[h], target, cap, tol);
    // From the tree, receivers come least loaded first: if this one has no room for a slice,
    // none after it has.
    if (rows == 0 && i >= held) break;
    const bool weights_there = prefetched_.has(e, h);
    const int64_t wanted = rows;
    if constexpr (Rule::kTimed) {
      if (rows > 0) rows = rows_in_time(rule, e, d, h, rows, weights_there);
    }
    if (rows == 0) {
      misses += i >= held ? 1 : 0;
      continue;
    }
    // A helper whose window or room took only part of its share does not count against the
    // limit.
    if ((rows < wanted || rows < share) && allowed < others) ++allowed;
    give(rule, e, d, h, rows, weights_there, out);
    ++helpers;
    if (excluded_[h] == 1) refresh(rule, h);  // still in the tree: its new state now
  }
  // The receivers set aside are offered again, with their state now.
  for (int g : excluded_list_) {
    if (excluded_[g] == 2) refresh(rule, g);
    excluded_[g] = 0;
  }
  excluded_list_.clear();
}

size_t Spill::offer_prefetched(int e, int d) {
  receivers_.clear();
  for (const int h : prefetched_.helpers_of(e)) {
    if (h != d && loads_.has_room(h) && ctx_.topo.same_domain(h, d)) receivers_.push_back(h);
  }
  sort_ids_ascending(receivers_, [&](int g) { return loads_.load[g]; });
  const size_t held = receivers_.size();
  for (size_t i = 0; i < held; ++i) exclude(receivers_[i], false);
  return held;
}

template <typename Rule>
void Spill::give(Rule& rule, int e, int d, int h, int64_t rows, bool weights_there, Plan& out) {
  const double t = copies_.copy_ms(rows, !weights_there);
  const double lands_ms = t > 0 ? copies_.links.add(d, h, t) : 0.0;
  rule.record(loads_.remaining(e), d, h, rows, t > 0, lands_ms);
  loads_.move(e, d, h, rows, weights_there);
  out.add_migration(e, d, h, rows, ctx_.shape, weights_there, mode_->path == FeplbPath::kOneHop);
}

template <typename Rule>
int64_t Spill::rows_in_time(const Rule& rule, int e, int d, int h, int64_t rows,
                            bool weights_there) const {
  const int64_t min_rows = mode_->min_slice_rows, align = mode_->slice_align_rows;
  const int64_t held = loads_.remaining(e);
  const auto fits = [&](int64_t r) {
    const double t = copies_.copy_ms(r, !weights_there);
    return t <= 0 || rule.fits(held, d, h, r, copies_.links.start(d, h, t) + t);
  };
  if (fits(rows)) return rows;
  const int64_t top = std::min(rows - 1, held - min_rows);
  const int64_t lo = (min_rows + align - 1) / align;
  const int64_t hi = top / align;  // the largest multiple that fits, in [lo, hi]
  if (hi < lo || !fits(lo * align)) return 0;
  return last_true(lo, hi, [&](int64_t m) { return fits(m * align); }) * align;
}

template <typename Rule>
bool Spill::next_receiver(const Rule& rule, int e, int d, int64_t target, int64_t tol,
                          bool gather) {
  const int64_t min_rows = mode_->min_slice_rows;
  ReceiverTree::Need need;
  need.timing = Rule::kTreeTiming;
  // Gathering, the copies to the receivers found so far are queued on d's egress first.
  need.out_ms = gather ? gather_out_ms_ : copies_.links.out_ms(d);
  need.fixed_ms = copies_.copy_ms(0, true);
  need.per_row_ms = copies_.per_row_ms();
  need.rows = std::min(loads_.remaining(e), loads_.shed_rows(e, d, target - tol));
  need.finish_by_ms = rule.finish_by_ms(d);
  need.skip = excluded_.data();
  // The least loaded receiver whose copy of the excess lands in time, else one whose copy of a
  // minimum slice does. When the donor's egress is busy (its earlier copies are queued), the
  // first must also leave a receiver that keeps room for as much again below the target the
  // window for a minimum slice: a late copy into a short window would strand the rest of the
  // receiver's room behind it.
  if (need.out_ms > copies_.start_ms()) {
    need.reserve_to = target;
    need.reserve_rows = std::max(min_rows, need.rows);
    need.reserve_ms = copies_.copy_ms(min_rows, true);
  }
  const int h = find_receiver(need, !gather && excluded_list_.empty());
  if (h < 0) return false;
  if (gather) {
    const int64_t rows = std::min(
        gather_rows_,
        std::max<int64_t>(0, loads_.measure.rows_within(target - loads_.load[h], gather_rows_)));
    gather_rows_ -= rows;
    gather_out_ms_ = std::max(gather_out_ms_, copies_.links.in_ms(h)) +
                     copies_.copy_ms(rows, !prefetched_.has(e, h));
  }
  exclude(h, gather);
  receivers_.push_back(h);
  return true;
}

int Spill::find_receiver(ReceiverTree::Need need, bool reusable) {
  if (reusable && last_find_.version == tree_.version() && same_need(last_find_.need, need))
    return last_find_.gpu;
  const ReceiverTree::Need asked = need;
  int h = tree_.find(need);
  need.reserve_to = 0;
  if (h < 0 && need.per_row_ms > 0 && need.rows > mode_->min_slice_rows) {
    need.rows = mode_->min_slice_rows;
    h = tree_.find(need);
  }
  if (reusable) last_find_ = {tree_.version(), asked, h};
  return h;
}

bool Spill::same_need(const ReceiverTree::Need& a, const ReceiverTree::Need& b) {
  return a.timing == b.timing && a.out_ms == b.out_ms && a.fixed_ms == b.fixed_ms &&
         a.per_row_ms == b.per_row_ms && a.rows == b.rows && a.reserve_to == b.reserve_to &&
         a.reserve_rows == b.reserve_rows && a.reserve_ms == b.reserve_ms &&
         a.finish_by_ms == b.finish_by_ms && a.skip == b.skip;
}

int Spill::helpers_allowed(int e, int d, int64_t target) const {
  const int64_t excess =
      std::min(loads_.measure.units(loads_.remaining(e)), loads_.load[d] - target);
  const int64_t hot = target > 0 ? (2 * excess + target - 1) / target : 0;
  return static_cast<int>(
      std::min<int64_t>(ctx_.topo.domain_size() - 1, std::max(mode_->max_helpers_per_expert, hot)));
}

int64_t Spill::fill(int64_t level, int num) const {
  int64_t rows = 0;
  for (int i = 0; i < num; ++i) rows += std::max<int64_t>(0, level - loads_.load[receivers_[i]]);
  return rows;
}

int64_t Spill::helper_level(int e, int d, int num, int64_t target, int64_t rest) const {
  const int64_t whole = loads_.measure.units(loads_.remaining(e));
  const int64_t load_d = loads_.load[d];
  const int64_t at_target = std::min(fill(target, num), whole);
  if (at_target + rest >= load_d - target) return target;
  // The smallest level at which the helpers take what d sheds.
  const int64_t lo =
      first_true(0, load_d, [&](int64_t level) { return fill(level, num) >= load_d - level; });
  if (lo <= target || load_d - lo > whole) return target;
  return lo;
}

int64_t Spill::slice_for(int e, int d, int h, int64_t want, int64_t target, int64_t cap,
                         int64_t tol) const {
  const LoadMeasure& m = loads_.measure;
  const int64_t min_rows = mode_->min_slice_rows, align = mode_->slice_align_rows;
  const int64_t load_d = loads_.load[d];
  const int64_t avail = loads_.remaining(e), room = cap - loads_.load[h],
                row_room = loads_.row_cap - loads_.rows_at[h];
  // the whole rest of e as a new slice on h
  const bool whole_fits = m.units(avail) <= room && avail <= row_room;
  if (loads_.give_units(e, avail) <= load_d - target + tol && whole_fits) return avail;
  int64_t rows =
      std::min({avail, m.rows_within(want, avail), loads_.shed_rows(e, d, target), row_room});
  if (rows < avail) {
    const int64_t aligned = rows - rows % align;
    if (aligned >= min_rows && load_d - loads_.give_units(e, aligned) <=
                                   std::max(cap, load_d - loads_.give_units(e, rows) + tol)) {
      rows = aligned;
    }
  }
  if (rows < min_rows) rows = std::min({min_rows, avail, m.rows_within(room, avail), row_room});
  // Above the row cap, d gives what it must even beyond h's room (within h's row room).
  rows = std::max(rows, std::min({avail, loads_.rows_at[d] - loads_.row_cap, row_room}));
  if (avail - rows < min_rows && whole_fits) rows = avail;  // no sliver left at home
  return rows >= min_rows || rows == avail ? rows : 0;
}

void Spill::exclude(int g, bool in_tree) {
  if (!excluded_[g]) excluded_list_.push_back(g);
  excluded_[g] = in_tree ? 2 : 1;
  if (in_tree) tree_.set(leaf_of_[g], g, false, {});
}

// The rules a plan may take (copy_rules.h).
template void Spill::balance_domain(IgnoreCopyTime&, int, int64_t, int64_t, Plan&);
template void Spill::balance_domain(HiddenCopies&, int, int64_t, int64_t, Plan&);
template void Spill::balance_domain(ExposedBeforeDonor&, int, int64_t, int64_t, Plan&);
template void Spill::balance_domain(LateByBusiest&, int, int64_t, int64_t, Plan&);

}  // namespace feplb::feplb_detail
