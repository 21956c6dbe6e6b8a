#include "feplb/sim/cost_choice.h"

#include <filesystem>

#include "feplb/core/error.h"

namespace feplb {

CostChoice choose_cost_model(const std::string& choice, const ExpertShape& shape,
                             const Knobs& knobs, const std::string& data_dir,
                             std::string_view field) {
  CostChoice c;
  const auto roofline_label = [&] {
    return fmt::format("roofline ({:.0f} TFLOP/s, {:.0f} GB/s HBM, {} SMs; not measured)",
                       knobs.gemm_peak_tflops, knobs.hbm_gbps, knobs.num_sms);
  };
  if (choice == "roofline") {
    c.label = roofline_label();
    return c;
  }
  const bool bundled = choice == "auto" || choice.empty();
  std::string path = choice;
  if (bundled) {
    path = data_dir + "/cost/h200-glm5.json";
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      c.label = roofline_label();
      return c;
    }
  }
  auto table = std::make_unique<TableCostModel>(read_gemm_table(path));
  if (table->shape().hidden != shape.hidden || table->shape().ffn != shape.ffn ||
      table->shape().dtype != shape.dtype) {
    FEPLB_REQUIRE_INPUT(bundled, "{}: {} is for {}, the experts are {}", field, path,
                        table->shape().describe(), shape.describe());
    c.label = roofline_label() + " (the measured table is for another shape)";
    return c;
  }
  c.label = fmt::format("measured per-expert table ({}, {})", table->device(),
                        bundled ? "data/cost/h200-glm5.json" : path);
  c.model = std::move(table);
  return c;
}

}  // namespace feplb
