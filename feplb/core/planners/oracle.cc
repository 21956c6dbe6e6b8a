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
    return {true, static_cast<int64_t>(ctx_.topo.num_experts())};
  }

  void plan(const RoutingStep& routing, Plan& out) override {
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
      for (int i = 0; i < n; ++i) quota_[gpus_[i]] = total / n + (i < total % n ? 1 : 0);

      for (int donor : gpus_) {
        if (load_[donor] <= quota_[donor]) break;  // sorted: the rest are at or below quota
        auto local = topo.local_experts(donor);
        experts_.assign(local.begin(), local.end());
        sort_ids_descending(experts_, [&](int e) { return c[e]; });
        for (int e : experts_) {
          while (load_[donor] > quota_[donor] && moved_[e] < c[e]) {
            int h = -1;  // the receiver with the most room
            for (int g : gpus_) {
              if (load_[g] < quota_[g] && (h < 0 || quota_[g] - load_[g] > quota_[h] - load_[h]))
                h = g;
            }
            const int64_t rows =
                std::min({c[e] - moved_[e], load_[donor] - quota_[donor], quota_[h] - load_[h]});
            out.add_migration(e, donor, h, rows, ctx_.shape);
            out.dynamic[e] = 1;
            moved_[e] += rows;
            load_[donor] -= rows;
            load_[h] += rows;
          }
          if (load_[donor] <= quota_[donor]) break;
        }
      }
    }
    out.add_home_slices(topo, routing, moved_);
  }

 private:
  std::vector<int64_t> load_, moved_, quota_;
  std::vector<int> gpus_, experts_;
};

}  // namespace

std::unique_ptr<Planner> make_oracle_planner(const PlannerContext& ctx) {
  return std::make_unique<OraclePlanner>(ctx);
}

}  // namespace feplb
