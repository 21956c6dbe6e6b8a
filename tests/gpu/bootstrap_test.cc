// The NCCL communicator's ways in (feplb/cuda/nccl_comm.h), one process: a borrowed communicator
// is used and never destroyed by feplb; one made through a caller's all-gather works and is
// owned. (Two processes through the TCP rendezvous, and a peer that never joins NCCL:
// feplb_gpu_mp_tests.)
#include <gtest/gtest.h>
#include <nccl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/nccl_comm.h"
#include "tests/gpu/gpu_test_util.h"

namespace feplb {
namespace {

// all_gather_i32 of {7, 8, 9} over `t` (one rank) gives them back.
void expect_all_gather_works(cuda::Transport& t) {
  cuda::Stream s;
  cuda::DeviceBuffer<int32_t> one(3), all(3);
  const std::vector<int32_t> want{7, 8, 9};
  FEPLB_CUDA_CHECK(cudaMemcpy(one.get(), want.data(), one.bytes(), cudaMemcpyHostToDevice));
  t.all_gather_i32(one.get(), all.get(), 3, s.get());
  std::vector<int32_t> got(3);
  FEPLB_CUDA_CHECK(
      cudaMemcpyAsync(got.data(), all.get(), all.bytes(), cudaMemcpyDeviceToHost, s.get()));
  cuda::sync_with_timeout(s.get(), 30, "all_gather_i32");
  EXPECT_EQ(got, want);
}

TEST(NcclCommunicator, BorrowedIsUsedAndNeverDestroyed) {
  FEPLB_SKIP_WITHOUT_GPU();
  FEPLB_CUDA_CHECK(cudaSetDevice(0));
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);  // the framework's communicator
  {
    cuda::NcclCommunicator borrowed = cuda::NcclCommunicator::borrow(comm);
    EXPECT_FALSE(borrowed.owned());
    EXPECT_EQ(borrowed.comm(), static_cast<void*>(comm));
    EXPECT_EQ(borrowed.device(), 0);
    const auto t = borrowed.transport();
    expect_all_gather_works(*t);
    cuda::NcclCommunicator moved = std::move(borrowed);  // still borrowed after a move
    EXPECT_FALSE(moved.owned());
  }
  // Still alive after every feplb object that used it: NCCL answers, and it still works.
  int count = 0;
  EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
  EXPECT_EQ(count, 1);
  expect_all_gather_works(*cuda::make_nccl_transport(comm, 0));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);  // the owner's job
}

TEST(NcclCommunicator, BorrowingNothingIsAnInputError) {
  EXPECT_THROW(cuda::NcclCommunicator::borrow(nullptr), InputError);
}

TEST(NcclCommunicator, FromACallersAllGatherIsOwned) {
  FEPLB_SKIP_WITHOUT_GPU();
  int calls = 0;
  const dist::AllGatherBlobs one_rank = [&](const std::string& mine) {
    ++calls;
    return std::vector<std::string>{mine};
  };
  cuda::NcclCommunicator comm(/*rank=*/0, /*world_size=*/1, /*device=*/0, one_rank,
                              /*timeout_s=*/30);
  EXPECT_TRUE(comm.owned());
  EXPECT_EQ(calls, 1);  // the id is shared once
  expect_all_gather_works(*comm.transport());
  // An all-gather that fails is an Error naming it, before any NCCL call.
  const dist::AllGatherBlobs broken = [](const std::string&) -> std::vector<std::string> {
    throw std::runtime_error("process group is gone");
  };
  try {
    cuda::NcclCommunicator failed(0, 2, 0, broken, 30);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("process group is gone"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace feplb
