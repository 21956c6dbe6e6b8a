#include "feplb/sim/gemm_tables.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

namespace feplb {

std::string roofline_label(const Knobs& knobs, const GpuClass& gpu) {
  return fmt::format("roofline ({:.0f} TFLOP/s, {:.0f} GB/s HBM, {} SMs; {})",
                     knobs.gemm_peak_tflops, knobs.hbm_gbps, knobs.num_sms,
                     gpu.measured ? "not measured" : "ceilings from specifications, not measured");
}

CostModelChoice find_gemm_table(const std::string& dir, const std::string& shown_dir,
                                const ExpertShape& shape, const Knobs& knobs, const GpuClass& gpu) {
  namespace fs = std::filesystem;
  if (gpu.table_device.empty()) {
    return {nullptr, roofline_label(knobs, gpu) +
                         fmt::format(" (GPU class {} has no measured table)", gpu.name)};
  }
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const fs::directory_entry& f : fs::directory_iterator(dir, ec)) {
      if (f.is_regular_file(ec) && f.path().extension() == ".json") files.push_back(f.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    TableCostModel table = read_gemm_table(f.string());
    const ExpertShape& s = table.shape();
    if (s.hidden != shape.hidden || s.ffn != shape.ffn || s.dtype != shape.dtype) continue;
    if (table.device() != gpu.table_device) continue;
    CostModelChoice c;
    c.label = fmt::format("measured per-expert table ({}, {}/{})", table.device(), shown_dir,
                          f.filename().string());
    c.model = std::make_unique<TableCostModel>(std::move(table));
    return c;
  }
  return {nullptr, roofline_label(knobs, gpu) + fmt::format(" (no measured table for {} in {})",
                                                            shape.describe(), shown_dir)};
}

}  // namespace feplb
