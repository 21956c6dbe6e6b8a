// Rng: a seeded random stream that gives the same numbers on every platform (std::mt19937_64 is
// fully specified; the std distributions are not, so the few we need are written out here).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace feplb {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // A well-mixed seed for the sub-stream (a, b, c) of `seed` (splitmix64 finaliser), so that e.g.
  // step 7 of layer 2 draws the same numbers whatever else is generated.
  static uint64_t derive(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
    uint64_t x = seed;
    for (uint64_t v : {a, b, c}) {
      x += 0x9e3779b97f4a7c15ULL + v;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
      x ^= x >> 31;
    }
    return x;
  }

  uint64_t bits() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Standard normal (Marsaglia polar method).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double m = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * m;
    has_spare_ = true;
    return u * m;
  }
  // Gamma(shape, 1) (Marsaglia-Tsang; shape < 1 via the U^(1/shape) boost).
  double gamma(double shape) {
    if (shape < 1.0) {
      const double u = uniform();
      return gamma(shape + 1.0) * std::pow(u > 0 ? u : 0x1.0p-53, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
      if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
    }
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace feplb
