// GPU classes (feplb/core/gpu_class.h): the default class is the link and GEMM knobs' defaults,
// classes from specifications say so, and a knob that differs from its class is marked.
#include "feplb/core/gpu_class.h"

#include <gtest/gtest.h>

#include "feplb/core/error.h"
#include "feplb/core/knobs.h"

namespace feplb {
namespace {

TEST(GpuClass, TheDefaultClassGivesTheKnobDefaults) {
  const GpuClass& first = gpu_class_list().front();
  EXPECT_EQ(first.name, "h200");
  EXPECT_TRUE(first.measured);
  const Knobs defaults;
  Knobs applied;
  applied.copy_gbps = applied.internode_gbps = applied.gemm_peak_tflops = applied.hbm_gbps = 1;
  applied.num_sms = 1;
  apply_gpu_class(first, applied);
  EXPECT_EQ(applied.copy_gbps, defaults.copy_gbps);
  EXPECT_EQ(applied.internode_gbps, defaults.internode_gbps);
  EXPECT_EQ(applied.gemm_peak_tflops, defaults.gemm_peak_tflops);
  EXPECT_EQ(applied.hbm_gbps, defaults.hbm_gbps);
  EXPECT_EQ(applied.num_sms, defaults.num_sms);
  // The H200's measured peer copy-engine rate for a 72 MiB expert (two H200s over NVLink 4, one
  // direction: 379 GB/s at 64 MiB, 393 at 256 MiB).
  EXPECT_EQ(defaults.copy_gbps, 380.0);
  EXPECT_EQ(first.table_device, "NVIDIA H200");
}

TEST(GpuClass, ApplySetsOnlyTheClassKnobs) {
  Knobs k;
  k.dyn = 7;
  k.copy_setup_us = 9;
  apply_gpu_class(find_gpu_class("b200"), k);
  EXPECT_EQ(k.copy_gbps, 900.0);
  EXPECT_EQ(k.gemm_peak_tflops, 2250.0);
  EXPECT_EQ(k.hbm_gbps, 8000.0);
  EXPECT_EQ(k.num_sms, 148);
  EXPECT_EQ(k.dyn, 7);
  EXPECT_EQ(k.copy_setup_us, 9.0);
  validate_knobs(k);
}

TEST(GpuClass, SpecificationClassesAreMarkedEverywhereTheyArePrinted) {
  for (const GpuClass& g : gpu_class_list()) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.copy_gbps, 0);
    EXPECT_GT(g.internode_gbps, 0);
    EXPECT_GT(g.gemm_peak_tflops, 0);
    EXPECT_GT(g.num_sms, 0);
    if (g.measured) continue;
    EXPECT_TRUE(g.table_device.empty()) << g.name << ": a class from specifications has no table";
    EXPECT_NE(g.source.find("not measured"), std::string_view::npos) << g.name;
    Knobs k;
    apply_gpu_class(g, k);
    EXPECT_NE(describe_gpu(g, k).find("from specifications, not measured"), std::string::npos);
  }
  Knobs k;
  const GpuClass& h200 = find_gpu_class("h200");
  const std::string line = describe_gpu(h200, k);
  EXPECT_NE(line.find("measured"), std::string::npos);
  EXPECT_EQ(line.find("not measured"), std::string::npos) << line;
}

TEST(GpuClass, AKnobThatDiffersFromItsClassIsMarked) {
  const GpuClass& b200 = find_gpu_class("b200");
  Knobs k;
  apply_gpu_class(b200, k);
  EXPECT_EQ(describe_gpu(b200, k).find("set by"), std::string::npos);
  k.copy_gbps = 700;
  const std::string line = describe_gpu(b200, k);
  EXPECT_NE(line.find("700 GB/s (set by --copy-gbps; the class: 900)"), std::string::npos) << line;
}

TEST(GpuClass, UnknownNameIsAnInputError) {
  try {
    find_gpu_class("x100");
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--gpu"), std::string::npos) << what;
    EXPECT_NE(what.find("x100"), std::string::npos) << what;
    EXPECT_NE(what.find("h200"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace feplb
