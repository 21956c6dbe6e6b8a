// validate() on the plan shapes the anchors use: rows dispatched straight to a non-home GPU, and
// resident replicas (installed by a replica copy, then kept across micro-batches).
#include <gtest/gtest.h>

#include "feplb/core/error.h"
#include "test_util.h"

namespace feplb {
namespace {

using testing::step_from;

class PlanRules : public ::testing::Test {
 protected:
  // EP=2, 2 experts per GPU; expert 0 (home GPU 0) has 200 rows, the others 0.
  const Topology topo = Topology::contiguous(2, 8, 4);
  const ExpertShape shape{64, 32, Dtype::kBf16};
  const RoutingStep step = step_from({{100, 0, 0, 0}, {100, 0, 0, 0}});
  // 100 rows at home, 100 dispatched to GPU 1.
  Plan split() const {
    Plan p;
    p.clear(4);
    p.slices.push_back({0, 0, 100, RowSource::kHome});
    p.slices.push_back({0, 1, 100, RowSource::kDispatched});
    return p;
  }
  Copy weights(CopyKind kind, int dst) const { return {kind, 0, 0, dst, 0, shape.weight_bytes()}; }
  void check(const Plan& p) const { validate(p, topo, step, shape, PlanLimits{false, 4}); }
};

TEST_F(PlanRules, DispatchedRowsNeedWeightsCopiedOrResident) {
  Plan p = split();
  EXPECT_THROW(check(p), Error) << "no weights on GPU 1";
  p.copies.push_back(weights(CopyKind::kWeights, 1));
  EXPECT_NO_THROW(check(p)) << "weights copied for this micro-batch; no token copy needed";
  p = split();
  p.resident.push_back({0, 1});
  EXPECT_NO_THROW(check(p)) << "a resident replica installed earlier";
  p.copies.push_back(weights(CopyKind::kReplicaWeights, 1));
  EXPECT_NO_THROW(check(p)) << "a resident replica installed by this plan";
}

TEST_F(PlanRules, RejectsBrokenAnchorPlans) {
  Plan p = split();
  p.slices[0].source = RowSource::kDispatched;  // dispatched rows on the home are home rows
  p.copies.push_back(weights(CopyKind::kWeights, 1));
  EXPECT_THROW(check(p), Error);

  p = split();
  p.copies.push_back(weights(CopyKind::kReplicaWeights, 1));  // installed but not resident
  EXPECT_THROW(check(p), Error);

  p = split();
  p.resident.push_back({0, 1});
  p.copies.push_back(weights(CopyKind::kWeights, 1));  // copied again onto its own replica
  EXPECT_THROW(check(p), Error);

  p = split();
  p.resident.push_back({0, 1});
  p.resident.push_back({0, 0});  // a replica on the home
  EXPECT_THROW(check(p), Error);

  p = split();
  p.resident.push_back({0, 1});
  p.copies.push_back({CopyKind::kTokenRows, 0, 0, 1, 100, 100 * shape.row_bytes()});
  EXPECT_THROW(check(p), Error) << "dispatched rows are not copied from the home";

  p = split();
  p.resident.push_back({0, 1});
  p.resident.push_back({2, 0});
  p.resident.push_back({3, 0});
  EXPECT_NO_THROW(check(p));
  EXPECT_THROW(validate(p, topo, step, shape, PlanLimits{false, 1}), Error)
      << "GPU 0 holds 2 guests";
}

TEST_F(PlanRules, SerializeListsResidentReplicasOnlyWhenThereAreSome) {
  Plan p = split();
  p.copies.push_back(weights(CopyKind::kWeights, 1));
  EXPECT_EQ(serialize(p).find('P'), std::string::npos);
  p = split();
  p.resident.push_back({0, 1});
  EXPECT_NE(serialize(p).find("P 0 1\n"), std::string::npos);
}

}  // namespace
}  // namespace feplb
