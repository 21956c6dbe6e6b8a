// In-process A/B of two builds' planners: loads each build's feplb_planner_ab_side module into a
// link namespace of its own (dlmopen) and, ROUNDS times, lets A then B (B then A on odd rounds)
// make PLANS plans on the probes' workload; prints each side's median over all its plans and the
// median and quartiles over rounds of each round's B/A median ratio. A control run of a build
// against a copy of itself shows the noise floor (scripts/planner-ab does both).
//   feplb_planner_ab A/lib/libfeplb_planner_ab_side.so B/lib/libfeplb_planner_ab_side.so
//     --ranks 72 --experts 288 --domain 72 [--skew 5] [--rounds 100] [--plans 64]
#include <dlfcn.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <vector>

namespace {

using PlansUs = int (*)(int, int, double, int, int, double*);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string side[2];
  int R = 8, E = 128, D = 8, rounds = 100, plans = 64;
  double skew = 5;
  CLI::App app{"feplb_planner_ab: two builds' planners in one process, interleaved"};
  app.add_option("A", side[0], "build A's libfeplb_planner_ab_side.so")->required();
  app.add_option("B", side[1], "build B's libfeplb_planner_ab_side.so")->required();
  app.add_option("--ranks", R, "GPUs")->check(CLI::Range(2, 4096));
  app.add_option("--experts", E, "experts")->check(CLI::Range(2, 65536));
  app.add_option("--domain", D, "GPUs per NVLink domain")->check(CLI::Range(1, 4096));
  app.add_option("--skew", skew, "lognormal max/mean expert load")->check(CLI::Range(1.0, 1e3));
  app.add_option("--rounds", rounds, "rounds (A and B once each)")->check(CLI::Range(2, 100000));
  app.add_option("--plans", plans, "plans per side and round")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  if (R % D != 0 || E % R != 0) {
    fmt::print(stderr,
               "feplb_planner_ab: {} GPUs in domains of {} with {} experts: need whole "
               "domains and an equal number of experts per GPU\n",
               R, D, E);
    return 2;
  }
  PlansUs f[2];
  for (int i = 0; i < 2; ++i) {
    void* h = dlmopen(LM_ID_NEWLM, side[i].c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      fmt::print(stderr, "feplb_planner_ab: {}\n", dlerror());
      return 1;
    }
    f[i] = reinterpret_cast<PlansUs>(dlsym(h, "plans_us"));
    if (f[i] == nullptr) {
      fmt::print(stderr, "feplb_planner_ab: no plans_us in {}\n", side[i]);
      return 1;
    }
  }
  std::vector<double> all[2], ratios, buf(static_cast<size_t>(plans));
  for (int i = 0; i < 2; ++i) {  // set up, warm
    if (f[i](R, E, skew, D, plans, buf.data()) != 0) return 1;
  }
  for (int r = 0; r < rounds; ++r) {
    double med[2];
    for (int k = 0; k < 2; ++k) {
      const int i = (r % 2 == 0) ? k : 1 - k;
      if (f[i](R, E, skew, D, plans, buf.data()) != 0) return 1;
      med[i] = median(buf);
      all[i].insert(all[i].end(), buf.begin(), buf.end());
    }
    ratios.push_back(med[1] / med[0]);
  }
  std::sort(ratios.begin(), ratios.end());
  const auto faster = std::count_if(ratios.begin(), ratios.end(), [](double x) { return x < 1; });
  fmt::print(
      "R={} E={} D={}: A median {:.2f} us, B median {:.2f} us; B/A per round: median {:.3f}, "
      "quartiles {:.3f}-{:.3f}, B faster in {} of {}\n",
      R, E, D, median(all[0]), median(all[1]), ratios[ratios.size() / 2], ratios[ratios.size() / 4],
      ratios[ratios.size() * 3 / 4], faster, rounds);
  return 0;
}
