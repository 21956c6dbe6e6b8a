#include "feplb/sim/cost_choice.h"

#include <memory>

#include "feplb/core/error.h"

namespace feplb {

CostChoice choose_cost_model(const std::string& choice, const ExpertShape& shape,
                             const Knobs& knobs, const std::string& data_dir,
                             std::string_view field, const GpuClass& gpu) {
  CostChoice c;
  if (choice == "roofline") {
    c.label = roofline_label(knobs, gpu);
    return c;
  }
  if (choice == "auto" || choice.empty()) {
    return find_gemm_table(data_dir + "/cost", "data/cost", shape, knobs, gpu);
  }
  auto table = std::make_unique<TableCostModel>(read_gemm_table(choice));
  FEPLB_REQUIRE_INPUT(table->shape().hidden == shape.hidden && table->shape().ffn == shape.ffn &&
                          table->shape().dtype == shape.dtype,
                      "{}: {} is for {}, the experts are {}", field, choice,
                      table->shape().describe(), shape.describe());
  c.label = fmt::format("measured per-expert table ({}, {})", table->device(), choice);
  c.model = std::move(table);
  return c;
}

}  // namespace feplb
