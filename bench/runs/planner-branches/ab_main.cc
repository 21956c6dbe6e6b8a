// In-process A/B of two builds of the core (README.md): ab_main A.so B.so R E SKEW D ROUNDS PLANS.
// Loads each side into a link namespace of its own and, ROUNDS times, lets A then B (B then A on
// odd rounds) make PLANS plans; prints each side's median over all its plans and the median over
// rounds of the rounds' B/A median ratio.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

using PlansUs = void (*)(int, int, double, int, int, double*);

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: ab_main A.so B.so R E SKEW D ROUNDS PLANS\n");
    return 2;
  }
  PlansUs f[2];
  for (int i = 0; i < 2; ++i) {
    void* h = dlmopen(LM_ID_NEWLM, argv[1 + i], RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::fprintf(stderr, "ab_main: %s\n", dlerror());
      return 1;
    }
    f[i] = reinterpret_cast<PlansUs>(dlsym(h, "plans_us"));
    if (f[i] == nullptr) {
      std::fprintf(stderr, "ab_main: no plans_us in %s\n", argv[1 + i]);
      return 1;
    }
  }
  const int R = std::atoi(argv[3]), E = std::atoi(argv[4]), D = std::atoi(argv[6]);
  const double skew = std::atof(argv[5]);
  const int rounds = std::atoi(argv[7]), plans = std::atoi(argv[8]);
  std::vector<double> all[2], ratios, buf(static_cast<size_t>(plans));
  for (int i = 0; i < 2; ++i) f[i](R, E, skew, D, plans, buf.data());  // set up, warm
  for (int r = 0; r < rounds; ++r) {
    double med[2];
    for (int k = 0; k < 2; ++k) {
      const int i = (r % 2 == 0) ? k : 1 - k;
      f[i](R, E, skew, D, plans, buf.data());
      med[i] = median(buf);
      all[i].insert(all[i].end(), buf.begin(), buf.end());
    }
    ratios.push_back(med[1] / med[0]);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "R=%d E=%d: A median %.2f us, B median %.2f us; B/A per round: median %.3f, "
      "quartiles %.3f-%.3f, B faster in %d of %d\n",
      R, E, median(all[0]), median(all[1]), ratios[ratios.size() / 2], ratios[ratios.size() / 4],
      ratios[ratios.size() * 3 / 4],
      static_cast<int>(std::count_if(ratios.begin(), ratios.end(), [](double x) { return x < 1; })),
      rounds);
}
