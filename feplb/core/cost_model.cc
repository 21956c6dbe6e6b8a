#include "feplb/core/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "feplb/core/error.h"
#include "feplb/core/file_input.h"
#include "feplb/core/internal/json_stream.h"
#include "feplb/core/limits.h"

namespace feplb {
namespace {

struct Tile {
  int64_t m, n;
};
// Output tiles a Hopper bf16 GEMM library picks from; the model takes the fastest for each shape,
// as a heuristic-driven library would.
constexpr std::array<Tile, 5> kTiles{{{128, 256}, {256, 128}, {128, 128}, {64, 256}, {64, 128}}};
constexpr int64_t kCachedRows = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

RooflineCostModel::RooflineCostModel(const ExpertShape& shape, const Knobs& knobs)
    : shape_(shape),
      peak_flops_(knobs.gemm_peak_tflops * 1e12),
      hbm_bytes_per_s_(knobs.hbm_gbps * 1e9),
      num_sms_(knobs.num_sms),
      launch_ms_(knobs.gemm_launch_us * 1e-3),
      cache_(kCachedRows, -1.0) {}

double RooflineCostModel::gemm_ms(int64_t m, int64_t n, int64_t k) const {
  if (m <= 0) return 0.0;
  const double per_sm_flops = peak_flops_ / static_cast<double>(num_sms_);
  double compute_s = INFINITY;
  for (const Tile& t : kTiles) {
    const int64_t tiles = ceil_div(m, t.m) * ceil_div(n, t.n);
    const int64_t waves = ceil_div(tiles, num_sms_);
    const double tile_s =
        2.0 * static_cast<double>(t.m * t.n) * static_cast<double>(k) / per_sm_flops;
    compute_s = std::min(compute_s, static_cast<double>(waves) * tile_s);
  }
  const double bytes = static_cast<double>((m * k + k * n + m * n) * shape_.dtype_bytes());
  const double memory_s = bytes / hbm_bytes_per_s_;
  return std::max(compute_s, memory_s) * 1e3 + launch_ms_;
}

double RooflineCostModel::expert_ms(int64_t rows) const {
  if (rows <= 0) return 0.0;
  if (rows < kCachedRows && cache_[rows] >= 0) return cache_[rows];
  const int64_t H = shape_.hidden, F = shape_.ffn;
  // SwiGLU reads [rows, 2F] and writes [rows, F]: memory-bound elementwise kernel.
  const double act_ms =
      static_cast<double>(rows * 3 * F * shape_.dtype_bytes()) / hbm_bytes_per_s_ * 1e3 +
      launch_ms_;
  const double ms = gemm_ms(rows, 2 * F, H) + act_ms + gemm_ms(rows, H, F);
  if (rows < kCachedRows) cache_[rows] = ms;
  return ms;
}

double prefetch_window_us(const ExpertShape& shape, int64_t tokens_per_rank, const Knobs& knobs) {
  if (knobs.prefetch_window_us > 0) return knobs.prefetch_window_us;
  const double flops = 4.0 * static_cast<double>(tokens_per_rank) *
                       static_cast<double>(shape.hidden) * static_cast<double>(shape.hidden);
  return flops / (knobs.gemm_peak_tflops * 1e12) * 1e6;
}

TableCostModel::TableCostModel(std::vector<int64_t> rows, std::vector<double> ms, ExpertShape shape,
                               std::string device)
    : rows_(std::move(rows)), ms_(std::move(ms)), shape_(shape), device_(std::move(device)) {
  FEPLB_REQUIRE_INPUT(rows_.size() >= 2 && rows_.size() == ms_.size(),
                      "gemm table: needs at least 2 points and as many ms as rows ({} vs {})",
                      rows_.size(), ms_.size());
  for (size_t i = 0; i < rows_.size(); ++i) {
    FEPLB_REQUIRE_INPUT(rows_[i] > 0 && (i == 0 || rows_[i] > rows_[i - 1]),
                        "gemm table: rows[{}] = {} is not positive and increasing", i, rows_[i]);
    FEPLB_REQUIRE_INPUT(ms_[i] > 0 && ms_[i] <= limits::kMaxGemmMs,
                        "gemm table: ms[{}] = {} is not positive and at most {:g}", i, ms_[i],
                        limits::kMaxGemmMs);
  }
}

double TableCostModel::expert_ms(int64_t rows) const {
  if (rows <= 0) return 0.0;
  if (rows <= rows_.front()) return ms_.front();  // the smallest GEMM's fixed cost
  if (rows < kCachedRows) {
    if (cache_.empty()) cache_.assign(kCachedRows, -1.0);
    double& cached = cache_[static_cast<size_t>(rows)];
    if (cached < 0) cached = interpolate(rows);
    return cached;
  }
  return interpolate(rows);
}

double TableCostModel::interpolate(int64_t rows) const {
  size_t i =
      static_cast<size_t>(std::upper_bound(rows_.begin(), rows_.end(), rows) - rows_.begin());
  const bool beyond = i >= rows_.size();
  if (beyond) i = rows_.size() - 1;  // extrapolate with the last segment
  const double x0 = static_cast<double>(rows_[i - 1]), x1 = static_cast<double>(rows_[i]);
  const double ms =
      ms_[i - 1] + (ms_[i] - ms_[i - 1]) * (static_cast<double>(rows) - x0) / (x1 - x0);
  // A last segment that falls (measurement noise) must not extrapolate below the last point.
  return beyond ? std::max(ms, ms_.back()) : ms;
}

namespace {

using json_stream::int_in;
using json_stream::Take;
using json_stream::type_of;

constexpr std::string_view kGemmTableFormat = "feplb-gemm-table-v1";

// The table document, streamed; every member is small and captured whole.
class GemmTableReader : public json_stream::Reader<GemmTableReader> {
 public:
  explicit GemmTableReader(const ByteSource& source) : Reader(source) {}

  Take take(bool object) {
    if (depth() == 0) {
      FEPLB_REQUIRE_INPUT(object, "expected a JSON object at the top, got array");
      return Take::stream();
    }
    return Take::whole(limits::kMaxGemmTablePoints * limits::kBytesPerFloat);
  }
  void opened(bool /*object*/) {}
  void closed(bool /*object*/) {}

  void value(json_stream::json&& v) {
    if (depth() == 0) {
      throw InputError(fmt::format("expected a JSON object at the top, got {}", type_of(v)));
    }
    const std::string& key = key_at(0);
    if (key == "format") {
      FEPLB_REQUIRE_INPUT(v.is_string() && v.get_ref<const std::string&>() == kGemmTableFormat,
                          "format: expected \"{}\", got {}", kGemmTableFormat, v.dump());
      format_ = true;
    } else if (key == "device") {
      FEPLB_REQUIRE_INPUT(v.is_string(), "device: expected a string, got {}", type_of(v));
      device_ = v.get<std::string>();
    } else if (key == "shape") {
      FEPLB_REQUIRE_INPUT(v.is_object(), "shape: expected an object, got {}", type_of(v));
      const auto dim = [&](const char* k) {
        const auto it = v.find(k);
        FEPLB_REQUIRE_INPUT(it != v.end(), "shape.{}: missing", k);
        return int_in(*it, fmt::format("shape.{}", k), 1, limits::kMaxExpertDim);
      };
      shape_.hidden = dim("hidden");
      shape_.ffn = dim("ffn");
      if (const auto it = v.find("dtype"); it != v.end()) {
        FEPLB_REQUIRE_INPUT(it->is_string(), "shape.dtype: expected a string, got {}",
                            type_of(*it));
        shape_.dtype = parse_dtype(it->get<std::string>(), "shape.dtype");
      }
      has_shape_ = true;
    } else if (key == "rows") {
      FEPLB_REQUIRE_INPUT(v.is_array(), "rows: expected an array, got {}", type_of(v));
      for (size_t i = 0; i < v.size(); ++i) {
        rows_.push_back(int_in(v[i], fmt::format("rows[{}]", i), 1,
                               limits::kMaxTokensPerRank * limits::kMaxRanks));
      }
      has_rows_ = true;
    } else if (key == "ms") {
      FEPLB_REQUIRE_INPUT(v.is_array(), "ms: expected an array, got {}", type_of(v));
      for (size_t i = 0; i < v.size(); ++i) {
        ms_.push_back(json_stream::number(v[i], fmt::format("ms[{}]", i)));
      }
      has_ms_ = true;
    }
  }

  TableCostModel finish() {
    FEPLB_REQUIRE_INPUT(format_, "format: missing");
    FEPLB_REQUIRE_INPUT(has_shape_, "shape: missing");
    FEPLB_REQUIRE_INPUT(has_rows_, "rows: missing");
    FEPLB_REQUIRE_INPUT(has_ms_, "ms: missing");
    FEPLB_REQUIRE_INPUT(rows_.size() <= static_cast<size_t>(limits::kMaxGemmTablePoints),
                        "rows: {} points, more than the limit of {}", rows_.size(),
                        limits::kMaxGemmTablePoints);
    return TableCostModel(std::move(rows_), std::move(ms_), shape_, std::move(device_));
  }

 private:
  bool format_ = false, has_shape_ = false, has_rows_ = false, has_ms_ = false;
  ExpertShape shape_;
  std::string device_;
  std::vector<int64_t> rows_;
  std::vector<double> ms_;
};

TableCostModel read_gemm_table_from(ByteSource& source) {
  GemmTableReader reader(source);
  json_stream::parse(source, reader);
  return reader.finish();
}

}  // namespace

TableCostModel parse_gemm_table(std::string_view text) {
  ByteSource source(text, kGemmTableFormat, limits::kMaxGemmTableBytes);
  return read_gemm_table_from(source);
}

TableCostModel read_gemm_table(const std::string& path) {
  return parse_input(path, kGemmTableFormat, limits::kMaxGemmTableBytes, read_gemm_table_from);
}

std::string format_gemm_table(const TableCostModel& t) {
  nlohmann::ordered_json doc;
  doc["format"] = "feplb-gemm-table-v1";
  doc["device"] = t.device();
  doc["shape"] = {
      {"hidden", t.shape().hidden}, {"ffn", t.shape().ffn}, {"dtype", dtype_name(t.shape().dtype)}};
  doc["rows"] = t.rows();
  doc["ms"] = t.ms();
  return doc.dump(2) + "\n";
}

}  // namespace feplb
