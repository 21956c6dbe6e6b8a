// oracle: the floor. Rows may move freely between the GPUs of one NVLink domain (any split, any
// number of helpers, no slot or copy limits) but never across domains. The smallest possible
// token straggler is then max over domains of ceil(T_domain / GPUs) - mean, and this planner
// reaches it exactly: the ceil share goes to the most loaded GPUs, and overloaded GPUs hand
// rows, hottest expert first, to the GPU with the most room. A yardstick, not a runtime policy.
#include <algorithm>

#include "feplb/core/planners/policies.h"

namespace feplb {
namespace {

class OraclePlanner final : public Planner {
 public:
  using Planner::Planner;
  std::string_view name() const override { return "oracle"; }
  PlanLimits limits() const override {
    return {true, static_cast<int64_t>(ctx_.topo.num_experts()), true};
  }

  void make_plan(const RoutingStep& routing, Plan& out) override {
    const Topology& topo = ctx_.topo;
    const int E = topo.num_experts();
    const auto& c = routing.expert_counts;
    out.clear(E);
    home_loads(topo, routing, load_);
    moved_.assign(static_cast<size_t>(E), 0);
    quota_.assign(load_.size(), 0);

    for (int dom = 0; dom < topo.num_domains(); ++dom) {
      const int first = topo.first_gpu_of_domain(dom), n = topo.domain_size();
      gpus_.resize(static_cast<size_t>(n));
      int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        gpus_[i] = first + i;
        total += load_[first + i];
      }
      // Exact balance: total / n each, the remainder's +1 on the most loaded GPUs.
      sort_ids_descending(gpus_, [&](int g) { return load_[g]; });
      position_.resize(load_.size());
      for (int i = 0; i < n; ++i) {
        quota_[gpus_[i]] = total / n + (i < total % n ? 1 : 0);
        position_[gpus_[i]] = i;
      }

      // Receivers in a heap by room, most first (ties: earlier in gpus_): a receiver's room only
      // shrinks, so each one is popped, filled as far as the donor's expert goes, and pushed back
      // while room remains.
      heap_.clear();
      for (int i = 0; i < n; ++i) {
        const int g = gpus_[i];
        if (load_[g] < quota_[g]) heap_.push_back({quota_[g] - load_[g], i});
      }
      std::make_heap(heap_.begin(), heap_.end(), less_room_);
      for (int donor : gpus_) {
        if (load_[donor] <= quota_[donor]) break;  // sorted: the rest are at or below quota
        auto local = topo.local_experts(donor);
        experts_.assign(local.begin(), local.end());
        sort_ids_descending(experts_, [&](int e) { return c[e]; });
        for (int e : experts_) {
          while (load_[donor] > quota_[donor] && moved_[e] < c[e]) {
            std::pop_heap(heap_.begin(), heap_.end(), less_room_);
            const int h = gpus_[heap_.back().index];  // the receiver with the most room
            heap_.pop_back();
            const int64_t rows =
                std::min({c[e] - moved_[e], load_[donor] - quota_[donor], quota_[h] - load_[h]});
            out.add_migration(e, donor, h, rows, ctx_.shape);
            out.dynamic[e] = 1;
            moved_[e] += rows;
            load_[donor] -= rows;
            load_[h] += rows;
            if (load_[h] < quota_[h]) {
              heap_.push_back({quota_[h] - load_[h], position(h)});
              std::push_heap(heap_.begin(), heap_.end(), less_room_);
            }
          }
          if (load_[donor] <= quota_[donor]) break;
        }
      }
    }
    out.add_home_slices(topo, routing, moved_);
  }

 private:
  struct Room {
    int64_t room;
    int index;  // position in gpus_
  };
  static constexpr auto less_room_ = [](const Room& a, const Room& b) {
    return a.room != b.room ? a.room < b.room : a.index > b.index;
  };
  int position(int gpu) const { return position_[gpu]; }
  std::vector<int64_t> load_, moved_, quota_;
  std::vector<int> gpus_, experts_, position_;
  std::vector<Room> heap_;
};

}  // namespace

std::unique_ptr<Planner> make_oracle_planner(const PlannerContext& ctx) {
  return std::make_unique<OraclePlanner>(ctx);
}

}  // namespace feplb
