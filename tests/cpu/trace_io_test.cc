// Trace and prior reader tests: format_trace/parse_trace round trips, and every kind of bad input
// is an InputError whose one-line message names the field (and the step index where there is one).
#include "feplb/core/trace_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "feplb/core/error.h"
#include "feplb/sim/prior.h"

namespace feplb {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A valid document: E=8 experts, R=4 ranks, S=2 tokens per rank, top-2, four steps
// (micro-batches 0 and 1 x layers 0 and 1). Every row puts 2 rows on two different experts.
json valid_doc() {
  json doc = {{"format", "feplb-trace-v1"},
              {"model", "unit-test"},
              {"num_experts", 8},
              {"top_k", 2},
              {"num_ranks", 4},
              {"tokens_per_rank", 2}};
  json steps = json::array();
  for (int i = 0; i < 4; ++i) {
    json rows = json::array();
    for (int r = 0; r < 4; ++r) {
      std::vector<int64_t> row(8, 0);
      row[static_cast<size_t>((r + i) % 8)] = 2;
      row[static_cast<size_t>((r + i + 3) % 8)] = 2;
      rows.push_back(row);
    }
    steps.push_back({{"step", i / 2}, {"layer", i % 2}, {"counts", rows}});
  }
  doc["steps"] = steps;
  return doc;
}

// Runs parse_trace on `text`, expects an InputError, and returns its message. Any other outcome
// (no throw, another exception) is a test failure.
std::string parse_error_of(const std::string& text) {
  try {
    parse_trace(text);
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InputError, but parse_trace accepted:\n" << text.substr(0, 400);
  return "";
}

// Expects parse_trace(text) to fail with a single-line message containing every one of `parts`.
void expect_trace_error(const std::string& text, std::initializer_list<std::string> parts) {
  const std::string msg = parse_error_of(text);
  if (msg.empty()) return;  // already reported
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  for (const std::string& p : parts) {
    EXPECT_NE(msg.find(p), std::string::npos) << "message does not name '" << p << "': " << msg;
  }
}

void expect_trace_error(const json& doc, std::initializer_list<std::string> parts) {
  expect_trace_error(doc.dump(), parts);
}

// The same for parse_prior.
void expect_prior_error(const std::string& text, std::initializer_list<std::string> parts) {
  std::string msg;
  try {
    parse_prior(text);
    ADD_FAILURE() << "expected InputError, but parse_prior accepted:\n" << text.substr(0, 400);
    return;
  } catch (const InputError& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
    return;
  }
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  for (const std::string& p : parts) {
    EXPECT_NE(msg.find(p), std::string::npos) << "message does not name '" << p << "': " << msg;
  }
}

void expect_prior_error(const json& doc, std::initializer_list<std::string> parts) {
  expect_prior_error(doc.dump(), parts);
}

// A fresh, empty scratch directory for file tests.
std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / ("feplb_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// --- Valid traces --------------------------------------------------------------------------

Trace handmade_trace() {
  Trace t;
  t.model = "glm5-handmade";
  t.num_experts = 4;
  t.top_k = 2;
  t.num_ranks = 2;
  t.tokens_per_rank = 3;
  t.expert_shape = ExpertShape{64, 128, Dtype::kFp8};
  t.generator_json = R"({"seed":7,"tool":"test"})";
  const int64_t rows[3][2][4] = {
      {{3, 1, 2, 0}, {0, 3, 3, 0}}, {{1, 1, 1, 3}, {2, 2, 2, 0}}, {{0, 0, 3, 3}, {3, 0, 0, 3}}};
  for (int i = 0; i < 3; ++i) {
    RoutingStep s(i, 5 - i, t.num_ranks, t.num_experts);
    for (int r = 0; r < 2; ++r) {
      for (int e = 0; e < 4; ++e) s.at(r, e) = rows[i][r][e];
    }
    s.sum_experts();
    t.steps.push_back(s);
  }
  return t;
}

void expect_same_trace(const Trace& a, const Trace& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.num_ranks, b.num_ranks);
  EXPECT_EQ(a.tokens_per_rank, b.tokens_per_rank);
  ASSERT_EQ(a.expert_shape.has_value(), b.expert_shape.has_value());
  if (a.expert_shape) {
    EXPECT_EQ(a.expert_shape->hidden, b.expert_shape->hidden);
    EXPECT_EQ(a.expert_shape->ffn, b.expert_shape->ffn);
    EXPECT_EQ(a.expert_shape->dtype, b.expert_shape->dtype);
  }
  EXPECT_EQ(a.generator_json.empty(), b.generator_json.empty());
  if (!a.generator_json.empty()) {
    EXPECT_EQ(json::parse(a.generator_json), json::parse(b.generator_json));
  }
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].step, b.steps[i].step) << "step " << i;
    EXPECT_EQ(a.steps[i].layer, b.steps[i].layer) << "step " << i;
    EXPECT_EQ(a.steps[i].num_ranks, b.steps[i].num_ranks) << "step " << i;
    EXPECT_EQ(a.steps[i].num_experts, b.steps[i].num_experts) << "step " << i;
    EXPECT_EQ(a.steps[i].counts, b.steps[i].counts) << "step " << i;
    EXPECT_EQ(a.steps[i].expert_counts, b.steps[i].expert_counts) << "step " << i;
  }
}

TEST(TraceIo, FormatThenParseRoundTrips) {
  const Trace t = handmade_trace();
  const std::string text = format_trace(t);
  const Trace back = parse_trace(text);
  expect_same_trace(t, back);
  EXPECT_EQ(format_trace(back), text);
  EXPECT_EQ(back.steps[1].expert_counts, (std::vector<int64_t>{3, 3, 3, 3}));
}

TEST(TraceIo, RoundTripWithoutOptionalFields) {
  Trace t = handmade_trace();
  t.model.clear();
  t.expert_shape.reset();
  t.generator_json.clear();
  const Trace back = parse_trace(format_trace(t));
  expect_same_trace(t, back);
  EXPECT_FALSE(back.expert_shape.has_value());
  EXPECT_TRUE(back.generator_json.empty());
}

TEST(TraceIo, BundledTraceRoundTrips) {
  const Trace t = read_trace(std::string(FEPLB_DATA_DIR) + "/traces/default.json");
  ASSERT_FALSE(t.steps.empty());
  EXPECT_EQ(t.num_experts, 128);
  ASSERT_TRUE(t.expert_shape.has_value());
  const std::string text = format_trace(t);
  const Trace back = parse_trace(text);
  expect_same_trace(t, back);
  EXPECT_EQ(format_trace(back), text);
}

TEST(TraceIo, ValidDocumentParses) {
  const Trace t = parse_trace(valid_doc().dump());
  EXPECT_EQ(t.model, "unit-test");
  EXPECT_EQ(t.num_experts, 8);
  EXPECT_EQ(t.top_k, 2);
  EXPECT_EQ(t.num_ranks, 4);
  EXPECT_EQ(t.tokens_per_rank, 2);
  ASSERT_EQ(t.steps.size(), 4u);
  EXPECT_EQ(t.steps[3].step, 1);
  EXPECT_EQ(t.steps[3].layer, 1);
  EXPECT_EQ(t.steps[3].at(2, 5), 2);
  for (const RoutingStep& s : t.steps) EXPECT_EQ(s.total_rows(), 4 * 2 * 2);
}

TEST(TraceIo, ZeroTokensPerRankWithZeroCountsIsValid) {
  json doc = valid_doc();
  doc["tokens_per_rank"] = 0;
  for (json& step : doc["steps"]) {
    for (json& row : step["counts"]) row = std::vector<int64_t>(8, 0);
  }
  const Trace t = parse_trace(doc.dump());
  EXPECT_EQ(t.tokens_per_rank, 0);
  ASSERT_EQ(t.steps.size(), 4u);
  for (const RoutingStep& s : t.steps) EXPECT_EQ(s.total_rows(), 0);
  // A nonzero count with zero tokens is above tokens_per_rank.
  doc["steps"][2]["counts"][1][0] = 1;
  expect_trace_error(doc, {"steps[2].counts[1][0]"});
}

TEST(TraceIo, AcceptsWhitespaceAndReorderedKeys) {
  const std::string text = R"(
    { "steps": [ {"counts": [[2, 2, 0, 0], [1, 1, 1, 1]], "layer": 0, "step": 0} ],
      "tokens_per_rank": 2, "num_ranks": 2, "top_k": 2, "num_experts": 4,
      "format": "feplb-trace-v1" }
  )";
  const Trace t = parse_trace(text);
  EXPECT_EQ(t.steps[0].expert_counts, (std::vector<int64_t>{3, 3, 1, 1}));
  EXPECT_TRUE(t.model.empty());
}

// --- Document-level errors -----------------------------------------------------------------

TEST(TraceIoErrors, MalformedJson) {
  for (const std::string text :
       {"", "{", "{\"format\":", "{\"format\":\"feplb-trace-v1\",}", "{} trailing", "[1,2",
        "{'format':1}", "nul", "{\"a\":01}", "{\"model\":\"\xff\xfe\"}"}) {
    SCOPED_TRACE(text);
    expect_trace_error(text, {"malformed JSON"});
  }
}

// The counts are read straight from the source while they are plain integers (trace_io.cc,
// read_plain_counts); what they hand back to the JSON parser, and the commas they consume, must
// keep every malformed row malformed.
TEST(TraceIoErrors, MalformedCountRows) {
  const std::string good = valid_doc().dump();
  const std::string row = "[2,0,0,2,0,0,0,0]";
  ASSERT_NE(good.find(row), std::string::npos);
  const auto with_row = [&](const std::string& bad) {
    std::string text = good;
    text.replace(text.find(row), row.size(), bad);
    return text;
  };
  for (const std::string bad :
       {"[2,0,0,2,0,0,0,0,]", "[2,0,0,2,0,0,0 0]", "[2,0,0,2,0,0,0,,0]", "[2,0,0,2,0,0,0:0]",
        "[2,0,0,2,0,0,00,0]", "[2,0,0,2,0,0,0,01]", "[,2,0,0,2,0,0,0,0]"}) {
    SCOPED_TRACE(bad);
    expect_trace_error(with_row(bad), {"malformed JSON"});
  }
  expect_trace_error(with_row("[2,0,0,2,0,0,0,0"), {"steps[0].counts[0]"});
  expect_trace_error(with_row("[2,0,0,2,0,0,0,0.5]"), {"expected an integer", "0.5"});
  expect_trace_error(with_row("[2,0,0,2,0,0,0,-1]"), {"-1"});
  expect_trace_error(with_row("[2,0,0,2,0,0,0,\"0\"]"), {"expected an integer", "string"});
  expect_trace_error(with_row("[2,0,0,2,0,0,0,99999999999]"), {"99999999999"});
  // Whitespace anywhere a JSON document allows it, and -0, read as before.
  const Trace t = parse_trace(with_row("[ 2 ,\n0,\t0 , 2,0,0,0,-0 ]"));
  EXPECT_EQ(t.steps[0].at(0, 0), 2);
}

// A file is read in 64 KiB chunks: counts that straddle a chunk boundary, in any whitespace, read
// the same as from memory.
TEST(TraceIo, CountsAcrossChunkBoundariesReadAsFromMemory) {
  json doc = valid_doc();
  std::string text = doc.dump();
  // Pad between rows with a varying amount of whitespace so that the chunk boundaries fall at
  // every position of a row.
  std::string padded;
  int pad = 0;
  for (char c : text) {
    padded += c;
    if (c == ',') padded += std::string(static_cast<size_t>(++pad % 7), ' ');
  }
  for (int i = 0; padded.size() < (size_t{3} << 16); ++i) {
    padded.insert(padded.size() - 1,
                  std::string(9973, ' ') + ",\"pad" + std::to_string(i) + "\":[1, 22, 333]");
  }
  const fs::path path = fs::path(::testing::TempDir()) / "feplb_chunks.json";
  std::ofstream(path, std::ios::binary) << padded;
  const Trace from_file = read_trace(path.string());
  const Trace from_text = parse_trace(text);
  ASSERT_EQ(from_file.steps.size(), from_text.steps.size());
  for (size_t i = 0; i < from_file.steps.size(); ++i) {
    EXPECT_EQ(from_file.steps[i].counts, from_text.steps[i].counts);
  }
}

// The JSON lexer never holds more than a token: a whitespace flood costs no memory, and a string
// or number beyond the free-form limit is refused where it is.
TEST(TraceIoErrors, WhitespaceFloodsAndLongTokens) {
  const std::string good = valid_doc().dump();
  const Trace t =
      parse_trace(std::string(size_t{8} << 20, ' ') + good + std::string(1 << 20, '\n'));
  EXPECT_EQ(t.steps.size(), 4u);
  std::string long_model = good;
  long_model.replace(long_model.find("unit-test"), 9, std::string((1 << 20) + 1, 'm'));
  expect_trace_error(long_model, {"a string longer than 1048576 bytes"});
  std::string long_number = good;
  long_number.replace(long_number.find("\"unit-test\""), 11, std::string((1 << 20) + 1, '7'));
  expect_trace_error(long_number, {"a token longer than 1048576 bytes"});
}

TEST(TraceIoErrors, TopLevelNotAnObject) {
  for (const std::string text : {"[]", "42", "\"feplb-trace-v1\"", "null", "true", "[{}]"}) {
    SCOPED_TRACE(text);
    expect_trace_error(text, {"top"});
  }
}

TEST(TraceIoErrors, FormatMissingOrWrong) {
  json doc = valid_doc();
  doc.erase("format");
  expect_trace_error(doc, {"format", "missing"});
  for (const json& bad : {json("feplb-trace-v2"), json("FEPLB-TRACE-V1"), json(""), json(1),
                          json(nullptr), json::array({"feplb-trace-v1"})}) {
    SCOPED_TRACE(bad.dump());
    doc["format"] = bad;
    expect_trace_error(doc, {"format"});
  }
}

TEST(TraceIoErrors, MissingRequiredFields) {
  for (const std::string field :
       {"num_experts", "top_k", "num_ranks", "tokens_per_rank", "steps"}) {
    SCOPED_TRACE(field);
    json doc = valid_doc();
    doc.erase(field);
    expect_trace_error(doc, {field, "missing"});
  }
}

TEST(TraceIoErrors, NonIntegerHeaderValues) {
  for (const std::string field : {"num_experts", "top_k", "num_ranks", "tokens_per_rank"}) {
    for (const json& bad : {json(3.5), json(2.0), json("7"), json(true), json(nullptr),
                            json::array({2}), json::object()}) {
      SCOPED_TRACE(field + " = " + bad.dump());
      json doc = valid_doc();
      doc[field] = bad;
      expect_trace_error(doc, {field, "integer"});
    }
  }
}

TEST(TraceIoErrors, NegativeAndZeroHeaderValues) {
  for (const std::string field : {"num_experts", "top_k", "num_ranks", "tokens_per_rank"}) {
    SCOPED_TRACE(field);
    json doc = valid_doc();
    doc[field] = -1;
    expect_trace_error(doc, {field, "-1"});
  }
  for (const std::string field : {"num_experts", "top_k", "num_ranks"}) {
    SCOPED_TRACE(field);
    json doc = valid_doc();
    doc[field] = 0;
    expect_trace_error(doc, {field});
  }
}

TEST(TraceIoErrors, HugeHeaderValues) {
  const std::string base = valid_doc().dump();
  for (const std::string field : {"num_experts", "top_k", "num_ranks", "tokens_per_rank"}) {
    for (const std::string huge :
         {"1e30", "18446744073709551615", "18446744073709551616", "9223372036854775807",
          "-9223372036854775808", "4294967297", "99999999999999999999999999"}) {
      SCOPED_TRACE(field + " = " + huge);
      json doc = json::parse(base);
      doc[field] = "@HUGE@";
      std::string text = doc.dump();
      text.replace(text.find("\"@HUGE@\""), 8, huge);
      expect_trace_error(text, {field});
    }
  }
}

TEST(TraceIoErrors, HeaderLimits) {
  json doc = valid_doc();
  doc["num_experts"] = (1 << 16) + 4;  // divisible by 4 ranks, above the limit
  expect_trace_error(doc, {"num_experts"});
  doc = valid_doc();
  doc["num_ranks"] = (1 << 14) * 2;
  expect_trace_error(doc, {"num_ranks"});
  doc = valid_doc();
  doc["tokens_per_rank"] = (int64_t{1} << 32) + 1;
  expect_trace_error(doc, {"tokens_per_rank"});
}

// Regression: a number beyond a double (1e400) made nlohmann throw out_of_range, which is not a
// parse_error, so it escaped the reader as a non-InputError (CLI exit 1, "[json.exception...]").
// The parser stops before the field is known, so the message names the token instead.
TEST(TraceIoErrors, NumberBeyondADoubleIsAnInputError) {
  for (const std::string field : {"num_experts", "tokens_per_rank", "model"}) {
    for (const std::string& bad :
         std::vector<std::string>{"1e400", "-1e400", "1" + std::string(400, '0') + ".5"}) {
      SCOPED_TRACE(field + " = " + bad.substr(0, 10));
      json doc = valid_doc();
      doc[field] = "@BAD@";
      std::string text = doc.dump();
      text.replace(text.find("\"@BAD@\""), 7, bad);
      expect_trace_error(text, {"malformed JSON", "number overflow", bad.substr(0, 10)});
    }
  }
  json doc = valid_doc();
  doc["steps"][3]["counts"][2][1] = "@BAD@";
  std::string text = doc.dump();
  text.replace(text.find("\"@BAD@\""), 7, "1e400");
  expect_trace_error(text, {"number overflow", "1e400"});
}

TEST(TraceIoErrors, ExpertsNotDivisibleByRanks) {
  json doc = valid_doc();
  doc["num_ranks"] = 3;
  expect_trace_error(doc, {"num_experts", "divisible", "3"});
}

TEST(TraceIoErrors, TopKAboveExperts) {
  json doc = valid_doc();
  doc["top_k"] = 9;
  expect_trace_error(doc, {"top_k", "9"});
}

TEST(TraceIoErrors, OptionalFieldsOfTheWrongType) {
  json doc = valid_doc();
  doc["model"] = 5;
  expect_trace_error(doc, {"model"});
  doc = valid_doc();
  doc["generator"] = "feplb trace gen";
  expect_trace_error(doc, {"generator"});
}

TEST(TraceIoErrors, ExpertShapeBad) {
  const json good = {{"hidden", 64}, {"ffn", 128}, {"dtype", "bf16"}};
  json doc = valid_doc();
  doc["expert_shape"] = good;
  EXPECT_EQ(parse_trace(doc.dump()).expert_shape->hidden, 64);

  struct Case {
    json shape;
    std::string field;
  };
  const std::vector<Case> cases = {
      {json::array({64, 128}), "expert_shape"},
      {"64x128", "expert_shape"},
      {{{"ffn", 128}}, "expert_shape.hidden"},
      {{{"hidden", 64}}, "expert_shape.ffn"},
      {{{"hidden", 0}, {"ffn", 128}}, "expert_shape.hidden"},
      {{{"hidden", -64}, {"ffn", 128}}, "expert_shape.hidden"},
      {{{"hidden", 64.5}, {"ffn", 128}}, "expert_shape.hidden"},
      {{{"hidden", 64}, {"ffn", "128"}}, "expert_shape.ffn"},
      {{{"hidden", 64}, {"ffn", (1 << 20) + 1}}, "expert_shape.ffn"},
      {{{"hidden", 64}, {"ffn", 128}, {"dtype", 16}}, "expert_shape.dtype"},
      {{{"hidden", 64}, {"ffn", 128}, {"dtype", "int4"}}, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.shape.dump());
    doc["expert_shape"] = c.shape;
    expect_trace_error(doc, {c.field});
  }
}

// --- Step-level errors ---------------------------------------------------------------------

TEST(TraceIoErrors, StepsNotANonEmptyArray) {
  json doc = valid_doc();
  doc["steps"] = json::array();
  expect_trace_error(doc, {"steps", "empty"});
  for (const json& bad : {json::object(), json("[]"), json(3), json(nullptr)}) {
    SCOPED_TRACE(bad.dump());
    doc["steps"] = bad;
    expect_trace_error(doc, {"steps", "array"});
  }
}

TEST(TraceIoErrors, StepNotAnObject) {
  for (const json& bad : {json(5), json::array(), json("step"), json(nullptr)}) {
    SCOPED_TRACE(bad.dump());
    json doc = valid_doc();
    doc["steps"][2] = bad;
    expect_trace_error(doc, {"steps[2]", "object"});
  }
}

TEST(TraceIoErrors, StepMissingMembers) {
  for (const std::string key : {"step", "layer", "counts"}) {
    SCOPED_TRACE(key);
    json doc = valid_doc();
    doc["steps"][3].erase(key);
    expect_trace_error(doc, {"steps[3]." + key, "missing"});
  }
}

TEST(TraceIoErrors, StepAndLayerBadValues) {
  for (const std::string key : {"step", "layer"}) {
    for (const std::string bad :
         {"-1", "1.5", "\"0\"", "true", "1e30", "18446744073709551615", "2147483648"}) {
      SCOPED_TRACE(key + " = " + bad);
      json doc = valid_doc();
      doc["steps"][1][key] = "@BAD@";
      std::string text = doc.dump();
      text.replace(text.find("\"@BAD@\""), 7, bad);
      expect_trace_error(text, {"steps[1]." + key});
    }
  }
}

TEST(TraceIoErrors, DuplicateStepAndLayer) {
  json doc = valid_doc();
  doc["steps"][3]["step"] = 0;
  doc["steps"][3]["layer"] = 1;  // same as steps[1]
  expect_trace_error(doc, {"steps[3]", "step 0 layer 1", "twice"});
  // The same step on different layers (and the same layer in different steps) is fine.
  EXPECT_NO_THROW(parse_trace(valid_doc().dump()));
}

TEST(TraceIoErrors, CountsNotAnArray) {
  json doc = valid_doc();
  doc["steps"][3]["counts"] = json::object();
  expect_trace_error(doc, {"steps[3].counts", "array"});
  doc["steps"][3]["counts"] = 16;
  expect_trace_error(doc, {"steps[3].counts", "array"});
}

TEST(TraceIoErrors, WrongNumberOfRows) {
  json doc = valid_doc();
  doc["steps"][3]["counts"].erase(3);
  expect_trace_error(doc, {"steps[3].counts", "3 rows", "num_ranks = 4"});
  doc = valid_doc();
  doc["steps"][0]["counts"].push_back(doc["steps"][0]["counts"][0]);
  expect_trace_error(doc, {"steps[0].counts", "5 rows"});
  doc["steps"][0]["counts"] = json::array();
  expect_trace_error(doc, {"steps[0].counts", "0 rows"});
}

TEST(TraceIoErrors, RowNotAnArray) {
  json doc = valid_doc();
  doc["steps"][3]["counts"][2] = 4;
  expect_trace_error(doc, {"steps[3].counts[2]", "array"});
}

TEST(TraceIoErrors, RowOfTheWrongLength) {
  json doc = valid_doc();
  doc["steps"][3]["counts"][2] = {2, 2, 0, 0, 0, 0, 0};
  expect_trace_error(doc, {"steps[3].counts[2]", "7 entries", "num_experts = 8"});
  doc["steps"][3]["counts"][2] = {2, 2, 0, 0, 0, 0, 0, 0, 0};
  expect_trace_error(doc, {"steps[3].counts[2]", "9 entries"});
  doc["steps"][3]["counts"][2] = json::array();
  expect_trace_error(doc, {"steps[3].counts[2]", "0 entries"});
}

TEST(TraceIoErrors, NegativeCount) {
  json doc = valid_doc();
  doc["steps"][3]["counts"][2] = {2, 2, 2, -2, 0, 0, 0, 0};  // sums to 4, but -2 is not a count
  expect_trace_error(doc, {"steps[3].counts[2][3]", "-2"});
}

TEST(TraceIoErrors, NonIntegerCounts) {
  for (const std::string bad : {"1.0", "3.0", "0.5", "2e0", "\"2\"", "true", "null", "[2]", "{}",
                                "1e30", "18446744073709551615"}) {
    SCOPED_TRACE(bad);
    json doc = valid_doc();
    doc["steps"][3]["counts"][2][1] = "@BAD@";
    std::string text = doc.dump();
    text.replace(text.find("\"@BAD@\""), 7, bad);
    expect_trace_error(text, {"steps[3].counts[2][1]"});
  }
}

TEST(TraceIoErrors, CountAboveTokensPerRank) {
  json doc = valid_doc();
  doc["steps"][1]["counts"][0] = {3, 1, 0, 0, 0, 0, 0, 0};  // sums to S*K = 4, but 3 > S = 2
  expect_trace_error(doc, {"steps[1].counts[0][0]", "3"});
}

TEST(TraceIoErrors, RowNotSummingToTokensTimesTopK) {
  json doc = valid_doc();
  doc["steps"][2]["counts"][3] = {2, 1, 0, 0, 0, 0, 0, 0};
  expect_trace_error(doc, {"steps[2].counts[3]", "sums to 3", "4"});
  doc["steps"][2]["counts"][3] = {2, 2, 2, 0, 0, 0, 0, 0};
  expect_trace_error(doc, {"steps[2].counts[3]", "sums to 6"});
}

// Regression: the [num_ranks, num_experts] matrix used to be allocated before the rows' lengths
// were checked, so a ~50 KB file asked for 8 GiB (std::bad_alloc or the OOM killer). A shape
// whose one step is above the trace's limit of counts is now refused from the header alone.
TEST(TraceIoErrors, HugeShapeWithTinyBodyIsRejectedCheaply) {
  json doc = valid_doc();
  doc["num_experts"] = 1 << 16;
  doc["num_ranks"] = 1 << 14;
  doc["steps"] = json::array({{{"step", 0}, {"layer", 0}, {"counts", json::array()}}});
  for (int r = 0; r < (1 << 14); ++r) doc["steps"][0]["counts"].push_back(json::array());
  expect_trace_error(doc, {"num_ranks x num_experts", "limit"});
  // Within the limit, the empty rows are named.
  doc["num_experts"] = 1 << 12;
  doc["num_ranks"] = 1 << 12;
  doc["steps"][0]["counts"] = json::array();
  for (int r = 0; r < (1 << 12); ++r) doc["steps"][0]["counts"].push_back(json::array());
  expect_trace_error(doc, {"steps[0].counts[0]", "0 entries"});
}

// Regression: a deeply nested value (in "format" for the error message, or in "generator", which
// is kept as text) used to be dump()ed recursively and overflowed the stack (SIGSEGV).
TEST(TraceIoErrors, DeepNestingIsAnInputError) {
  const int depth = 200000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  for (const std::string field : {"format", "generator", "model", "steps"}) {
    SCOPED_TRACE(field);
    json doc = valid_doc();
    doc[field] = "@NESTED@";
    std::string text = doc.dump();
    text.replace(text.find("\"@NESTED@\""), 10, "{\"a\":" + nested + "}");
    expect_trace_error(text, {"nested deeper than"});
  }
  // Shallow nesting in the generator object is kept.
  json doc = valid_doc();
  doc["generator"] = {{"a", {{"b", {1, {2, {3}}}}}}};
  EXPECT_EQ(json::parse(parse_trace(doc.dump()).generator_json), doc["generator"]);
}

// --- Duplicate keys, streaming order, uneven tokens and dropped rows ----------------------------

TEST(TraceIoErrors, DuplicateKeysAreRefusedAtEveryLevel) {
  const std::string base = valid_doc().dump();
  struct Case {
    std::string from, to, field;
  };
  // Each case turns one key of the valid document into a duplicate of its neighbour.
  const std::vector<Case> cases = {
      {"\"model\":\"unit-test\"", "\"model\":\"a\",\"model\":\"unit-test\"", "\"model\""},
      {"\"layer\":0,\"step\":1}", "\"layer\":0,\"layer\":0,\"step\":1}", "steps[2]"},
      {"\"format\":", "\"top_k\":2,\"format\":", "\"top_k\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    std::string text = base;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, c.from.size(), c.to);
    expect_trace_error(text, {"duplicate key", c.field});
  }
  json doc = valid_doc();
  doc["generator"] = {{"seed", 1}};
  std::string text = doc.dump();
  text.replace(text.find("{\"seed\":1}"), 10, "{\"a\":{\"x\":1,\"x\":2}}");
  expect_trace_error(text, {"generator.a", "duplicate key \"x\""});
}

TEST(TraceIo, HeaderAfterTheStepsIsCheckedAtTheEnd) {
  // nlohmann's json (and Python's sort_keys) writes "steps" before "tokens_per_rank" and "top_k".
  json doc = valid_doc();
  const std::string sorted = doc.dump();
  ASSERT_LT(sorted.find("\"steps\""), sorted.find("\"top_k\""));
  EXPECT_EQ(parse_trace(sorted).steps.size(), 4u);
  doc["steps"][1]["counts"][0] = {3, 1, 0, 0, 0, 0, 0, 0};  // 3 > S = 2, known only at the end
  expect_trace_error(doc, {"steps[1].counts[0][0]", "3"});
}

TEST(TraceIo, UnevenTokensAndDroppedRows) {
  json doc = valid_doc();
  doc["tokens_per_rank"] = 3;
  // Rank 0 has 3 tokens and drops 1 of its 6 rows; rank 1 has 1 token; ranks 2, 3 have 2.
  doc["steps"][0]["tokens"] = {3, 1, 2, 2};
  doc["steps"][0]["dropped"] = {1, 0, 0, 0};
  doc["steps"][0]["counts"][0] = {3, 1, 1, 0, 0, 0, 0, 0};
  doc["steps"][0]["counts"][1] = {1, 1, 0, 0, 0, 0, 0, 0};
  // Other steps: every rank has tokens_per_rank = 3 tokens unless stated, so state 2.
  for (int i = 1; i < 4; ++i) doc["steps"][i]["tokens"] = {2, 2, 2, 2};
  const Trace t = parse_trace(doc.dump());
  EXPECT_FALSE(t.uniform());
  EXPECT_EQ(t.steps[0].tokens, (std::vector<int64_t>{3, 1, 2, 2}));
  EXPECT_EQ(t.rows_of(t.steps[0], 0), 5);
  EXPECT_EQ(t.rows_of(t.steps[0], 1), 2);
  EXPECT_EQ(t.steps[0].total_rows(), 5 + 2 + 4 + 4);
  // Written back as read.
  const Trace back = parse_trace(format_trace(t));
  EXPECT_EQ(back.steps[0].tokens, t.steps[0].tokens);
  EXPECT_EQ(back.steps[0].dropped, t.steps[0].dropped);
  EXPECT_TRUE(back.steps[1].dropped.empty());
  EXPECT_EQ(format_trace(back), format_trace(t));

  json bad = doc;
  bad["steps"][0]["dropped"] = {0, 0, 0, 0};
  expect_trace_error(bad, {"steps[0].counts[0]", "sums to 5", "tokens[0] * top_k - dropped[0]"});
  bad = doc;
  bad["steps"][0]["tokens"] = {4, 1, 2, 2};
  expect_trace_error(bad, {"steps[0].tokens[0]", "above tokens_per_rank"});
  bad = doc;
  bad["steps"][0]["tokens"] = {3, 1, 2};
  expect_trace_error(bad, {"steps[0].tokens", "3 entries", "num_ranks = 4"});
  bad = doc;
  bad["steps"][0]["counts"][1] = {2, 0, 0, 0, 0, 0, 0, 0};  // 2 rows of one expert from 1 token
  expect_trace_error(bad, {"steps[0].counts[1][0]", "the rank's tokens"});
  bad = doc;
  bad["steps"][0]["dropped"] = {1, 0, 0, -1};
  expect_trace_error(bad, {"steps[0].dropped[3]", "-1"});
  bad = doc;
  bad["steps"][0]["dropped"] = {7, 0, 0, 0};
  expect_trace_error(bad, {"steps[0].dropped[0]", "above tokens * top_k"});
}

TEST(TraceIoErrors, TotalCountsAboveTheLimit) {
  // 2^27 + 1 counts cannot be written cheaply; the per-step shape limit is the same number.
  json doc = valid_doc();
  doc["num_experts"] = 1 << 14;
  doc["num_ranks"] = 1 << 14;
  expect_trace_error(doc, {"num_ranks x num_experts", "134217728"});
}

// --- Files ---------------------------------------------------------------------------------

TEST(TraceIoFiles, MissingFile) {
  const std::string path = (scratch_dir("missing") / "no-such-trace.json").string();
  try {
    read_trace(path);
    FAIL() << "read_trace accepted a missing file";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
  }
}

TEST(TraceIoFiles, Directory) {
  const std::string path = scratch_dir("directory").string();
  try {
    read_trace(path);
    FAIL() << "read_trace accepted a directory";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
}

TEST(TraceIoFiles, BadContentIsPrefixedWithThePath) {
  const std::filesystem::path dir = scratch_dir("badcontent");
  json doc = valid_doc();
  doc["steps"][3]["counts"][2][1] = -1;
  const std::string path = (dir / "bad.json").string();
  write_text(path, doc.dump());
  try {
    read_trace(path);
    FAIL() << "read_trace accepted a bad trace";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": steps[3].counts[2][1]", 0), 0u) << msg;
  }
  write_text(path, valid_doc().dump());
  EXPECT_EQ(read_trace(path).steps.size(), 4u);
}

// --- Priors --------------------------------------------------------------------------------

json valid_prior() {
  return {{"model", "unit-prior"},  {"source", "test"},
          {"experts", 4},           {"top_k", 2},
          {"layers", {0, 7}},       {"counts", {{10, 20, 30, 40}, {1, 1, 1, 1}}},
          {"tokens_per_layer", 50}, {"domain", "test"}};
}

TEST(PriorIo, ValidPriorParses) {
  const Prior p = parse_prior(valid_prior().dump());
  EXPECT_EQ(p.model, "unit-prior");
  EXPECT_EQ(p.top_k, 2);
  EXPECT_EQ(p.num_experts(), 4);
  EXPECT_EQ(p.layer_ids, (std::vector<int64_t>{0, 7}));
  EXPECT_DOUBLE_EQ(p.popularity[0][3], 0.4);
  EXPECT_DOUBLE_EQ(p.popularity[1][0], 0.25);
}

TEST(PriorIo, BundledPriorParses) {
  const Prior p =
      read_prior(std::string(FEPLB_DATA_DIR) + "/priors/olmoe-1b-7b__olmoe-repo__arxiv.json");
  EXPECT_EQ(p.num_experts(), 64);
  EXPECT_EQ(p.top_k, 8);
  EXPECT_EQ(p.num_layers(), 3);
}

TEST(PriorIoErrors, MalformedAndNotAnObject) {
  for (const std::string text : {"", "{", "{\"experts\":4,}", "nope"}) {
    SCOPED_TRACE(text);
    expect_prior_error(text, {"malformed JSON"});
  }
  for (const std::string text : {"[]", "4", "null"}) {
    SCOPED_TRACE(text);
    expect_prior_error(text, {"top"});
  }
}

TEST(PriorIoErrors, MissingFields) {
  for (const std::string field : {"experts", "top_k", "counts", "layers"}) {
    SCOPED_TRACE(field);
    json doc = valid_prior();
    doc.erase(field);
    expect_prior_error(doc, {field, "missing"});
  }
}

TEST(PriorIoErrors, BadExpertsAndTopK) {
  for (const std::string field : {"experts", "top_k"}) {
    for (const std::string bad : {"3.5", "\"4\"", "true", "null", "-1", "0", "1e30",
                                  "18446744073709551615", "99999999999999999999"}) {
      SCOPED_TRACE(field + " = " + bad);
      json doc = valid_prior();
      doc[field] = "@BAD@";
      std::string text = doc.dump();
      text.replace(text.find("\"@BAD@\""), 7, bad);
      expect_prior_error(text, {field});
    }
  }
  json doc = valid_prior();
  doc["experts"] = 70000;
  expect_prior_error(doc, {"experts"});
  doc = valid_prior();
  doc["top_k"] = 5;
  expect_prior_error(doc, {"top_k"});
}

// Regression: as for traces, 1e400 used to escape parse_prior as a non-InputError, and a deeply
// nested value crashed the dump() in the error message.
TEST(PriorIoErrors, NumberOverflowAndDeepNesting) {
  for (const std::string field : {"experts", "top_k"}) {
    SCOPED_TRACE(field);
    json doc = valid_prior();
    doc[field] = "@BAD@";
    std::string text = doc.dump();
    text.replace(text.find("\"@BAD@\""), 7, "1e400");
    expect_prior_error(text, {"number overflow", "1e400"});
    text = doc.dump();
    text.replace(text.find("\"@BAD@\""), 7, std::string(200000, '[') + std::string(200000, ']'));
    expect_prior_error(text, {"nested deeper than"});
  }
  json doc = valid_prior();
  doc["counts"][1][2] = "@BAD@";
  std::string text = doc.dump();
  text.replace(text.find("\"@BAD@\""), 7, "-1e400");
  expect_prior_error(text, {"number overflow", "-1e400"});
}

TEST(PriorIoErrors, BadCountsAndLayers) {
  json doc = valid_prior();
  doc["counts"] = json::array();
  expect_prior_error(doc, {"counts"});
  doc["counts"] = json::object();
  expect_prior_error(doc, {"counts"});

  doc = valid_prior();
  doc["layers"] = {0};
  expect_prior_error(doc, {"layers"});
  doc["layers"] = "0,7";
  expect_prior_error(doc, {"layers"});
  for (const json& bad : {json(-1), json(1.5), json("7"), json(nullptr)}) {
    SCOPED_TRACE(bad.dump());
    doc = valid_prior();
    doc["layers"][1] = bad;
    expect_prior_error(doc, {"layers[1]"});
  }

  doc = valid_prior();
  doc["counts"][1] = {1, 1, 1};
  expect_prior_error(doc, {"counts[1]", "4 entries"});
  doc["counts"][1] = 4;
  expect_prior_error(doc, {"counts[1]"});
  for (const std::string bad : {"-1", "\"1\"", "true", "null", "[1]"}) {
    SCOPED_TRACE(bad);
    doc = valid_prior();
    doc["counts"][1][2] = "@BAD@";
    std::string text = doc.dump();
    text.replace(text.find("\"@BAD@\""), 7, bad);
    expect_prior_error(text, {"counts[1][2]"});
  }
  doc = valid_prior();
  doc["counts"][0] = {0, 0, 0, 0};
  expect_prior_error(doc, {"counts[0]", "positive"});
}

TEST(PriorIoFiles, MissingFileAndDirectory) {
  const std::filesystem::path dir = scratch_dir("prior");
  const std::string missing = (dir / "nope.json").string();
  for (const std::string& path : {missing, dir.string()}) {
    SCOPED_TRACE(path);
    try {
      read_prior(path);
      ADD_FAILURE() << "read_prior accepted " << path;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
    }
  }
  const std::string bad = (dir / "bad.json").string();
  json doc = valid_prior();
  doc["top_k"] = 0;
  write_text(bad, doc.dump());
  try {
    read_prior(bad);
    ADD_FAILURE() << "read_prior accepted a bad prior";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(bad + ": top_k", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace feplb
