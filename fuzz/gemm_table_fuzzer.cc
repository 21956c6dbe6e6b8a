// libFuzzer target for the feplb-gemm-table-v1 reader (scripts/fuzz): parse_gemm_table may only
// accept a table of increasing positive row counts with positive finite times, or throw
// InputError; what it accepts must write back into an identical table.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "feplb/core/cost_model.h"
#include "fuzz_util.h"

namespace {

constexpr const char* kTarget = "gemm_table_fuzzer";
using feplb::fuzz::finding;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto t =
      feplb::fuzz::accept_or_refuse(kTarget, [&] { return feplb::parse_gemm_table(text); });
  if (!t) return 0;
  if (t->rows().size() < 2 || t->rows().size() != t->ms().size()) {
    finding(kTarget, "accepted a table without matching rows and ms");
  }
  for (size_t i = 0; i < t->rows().size(); ++i) {
    if (t->rows()[i] < 1 || (i > 0 && t->rows()[i] <= t->rows()[i - 1])) {
      finding(kTarget, "accepted rows that are not positive and increasing");
    }
    if (!(t->ms()[i] > 0) || !std::isfinite(t->ms()[i])) finding(kTarget, "accepted a bad time");
  }
  if (t->shape().hidden < 1 || t->shape().ffn < 1) finding(kTarget, "accepted a bad shape");
  for (int64_t rows : {int64_t{0}, int64_t{1}, t->rows().back() * 2}) {
    if (!std::isfinite(t->expert_ms(rows)) || t->expert_ms(rows) < 0) {
      finding(kTarget, "expert_ms is negative or not finite");
    }
  }
  feplb::fuzz::must_not_throw(kTarget, [&] {
    const feplb::TableCostModel back = feplb::parse_gemm_table(feplb::format_gemm_table(*t));
    if (back.rows() != t->rows() || back.ms() != t->ms() || back.device() != t->device() ||
        back.shape().hidden != t->shape().hidden || back.shape().ffn != t->shape().ffn) {
      finding(kTarget, "format_gemm_table/parse_gemm_table round trip changed the table");
    }
  });
  return 0;
}
