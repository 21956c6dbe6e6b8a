// CopyModel: when the copies feplb plans land, as the copy timer will time them: the links
// (CopyLinks) from when the plan's copies start, and one migration's copy time (link_ms()).
#pragma once

#include <cstdint>

#include "feplb/core/copy_links.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"

namespace feplb::feplb_detail {

class CopyModel {
 public:
  CopyModel(const ExpertShape& shape, const Knobs& knobs)
      : row_bytes_(shape.row_bytes()),
        gbps_(knobs.copy_gbps),
        setup_us_(knobs.copy_setup_us),
        weight_ms_(link_ms(shape.weight_bytes(), knobs.copy_gbps, knobs.copy_setup_us)),
        row_ms_(static_cast<double>(shape.row_bytes()) / (knobs.copy_gbps * 1e9) * 1e3) {}

  // This plan's copies: from `start_ms` (after the counts round trip and the planner, or when the
  // GEMMs start for a plan made before the dispatch); rows copied (two-phase) or dispatched.
  void start(int num_gpus, double start_ms, bool row_copies) {
    links.reset(num_gpus, start_ms);
    start_ms_ = start_ms;
    row_copies_ = row_copies;
  }
  double start_ms() const { return start_ms_; }

  // Time the phase-2 copies of one migration take on the links (0: none needed), computed as the
  // copy timer does (link_ms()).
  double copy_ms(int64_t rows, bool weights) const {
    return (weights ? weight_ms_ : 0.0) +
           (row_copies_ ? link_ms(rows * row_bytes_, gbps_, setup_us_) : 0.0);
  }
  // One more row's copy time (the receivers' tree's estimate; 0 when rows are dispatched).
  double per_row_ms() const { return row_copies_ ? row_ms_ : 0.0; }

  CopyLinks links;  // when the queued copies run

 private:
  const int64_t row_bytes_;
  const double gbps_, setup_us_;
  // Copy times: one expert's weights (setup included); one more row.
  const double weight_ms_, row_ms_;
  double start_ms_ = 0;
  bool row_copies_ = true;
};

}  // namespace feplb::feplb_detail
