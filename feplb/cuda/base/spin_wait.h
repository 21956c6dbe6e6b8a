// Host-side busy waiting for the layer's threads: react within a microsecond, but give the core
// away regularly, so that a thread that was woken (a barrier, a peer's caller thread) is not kept
// off a machine whose cores all spin (R virtual ranks x 2 threads on one host).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <thread>

namespace feplb::cuda {

inline void spin_pause(uint64_t spins) {
  if ((spins & 63) == 63) {
    std::this_thread::yield();
  } else {
    _mm_pause();
  }
}

}  // namespace feplb::cuda
