#include "feplb/cuda/host/signals.h"

#include "feplb/core/error.h"

namespace feplb::cuda {

std::string_view signal_family_name(SignalFamily family) {
  switch (family) {
    case SignalFamily::kInputsLanded:
      return "inputs_landed";
    case SignalFamily::kRowsBack:
      return "rows_back";
    case SignalFamily::kGradsBack:
      return "grads_back";
    case SignalFamily::kSlotsQuiet:
      return "slots_quiet";
    case SignalFamily::kPrefetchLanded:
      return "prefetch_landed";
  }
  return "?";
}

SignalLayout::SignalLayout(int world) : world_(world), quiet_(static_cast<size_t>(world), 0) {
  FEPLB_REQUIRE_INPUT(world >= 1, "signal layout of {} ranks", world);
}

int SignalLayout::slot(SignalFamily family, int from) const {
  FEPLB_CHECK(from >= 0 && from < world_, "signal {} from rank {} of {}",
              signal_family_name(family), from, world_);
  return static_cast<int>(family) * world_ + from;
}

}  // namespace feplb::cuda
