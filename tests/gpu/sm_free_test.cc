// The SM-hog test of the exact calls the layer's phase 2 issues: while a kernel
// holds every SM, ce_copy_and_signal (cudaMemcpyAsync D2D + stream memory write), a stream
// memory wait, and the in-process transport's cudaMemcpyBatchAsync must all complete. A copy
// that needed an SM would finish only after the hog; the test fails loudly if a driver or code
// change moves any of them onto SMs. The control (an SM copy kernel) must wait for the hog.
#include <gtest/gtest.h>

#include "bench/harness/kernels/kernels.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/transport.h"
#include "feplb/cuda/transport/ce_copy.h"
#include "feplb/cuda/transport/stream_ops.h"
#include "gpu_test_util.h"

namespace feplb {
namespace {

class SmFree : public ::testing::Test {
 protected:
  void SetUp() override {
    FEPLB_SKIP_WITHOUT_GPU();
    FEPLB_CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
    smem_ = prop_.sharedMemPerBlockOptin;
    FEPLB_CUDA_CHECK(cuda::kernels::hog_max_smem(smem_));
  }

  // Runs `work` on its own stream while a hog holds every SM for up to 2 s. The hog is released
  // as soon as the work is seen done (or after 1.5 s). Returns whether the work finished while
  // the hog still held every SM, checked on the host the moment the work is seen done.
  bool finishes_during_hog(const std::function<void(cudaStream_t)>& work) {
    cuda::Stream hog_stream, work_stream, release;
    cuda::DeviceBuffer<int> stop(1);
    FEPLB_CUDA_CHECK(cudaMemset(stop.get(), 0, 4));
    cuda::Event hog_end, work_end;
    FEPLB_CUDA_CHECK(cuda::kernels::sm_hog(prop_.multiProcessorCount, 2'000'000'000, stop.get(),
                                           smem_, hog_stream.get()));
    hog_end.record(hog_stream.get());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the hog occupy every SM
    work(work_stream.get());
    work_end.record(work_stream.get());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    bool done = false;
    while (!done && std::chrono::steady_clock::now() < deadline)
      done = cudaEventQuery(work_end.get()) == cudaSuccess;
    const bool hog_running = cudaEventQuery(hog_end.get()) == cudaErrorNotReady;
    const int one = 1;
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(stop.get(), &one, 4, cudaMemcpyHostToDevice, release.get()));
    FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
    return done && hog_running;
  }

  cudaDeviceProp prop_{};
  size_t smem_ = 0;
};

constexpr size_t kBytes = size_t{64} << 20;

TEST_F(SmFree, PhaseTwoCopiesAndSignalRunOnCopyEngines) {
  cuda::DeviceBuffer<char> src(kBytes), dst(kBytes);
  cuda::DeviceBuffer<uint32_t> flag(1);
  FEPLB_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  const bool ok = finishes_during_hog([&](cudaStream_t s) {
    const cuda::CeCopy copies[] = {{dst.get(), src.get(), kBytes / 2},
                                   {dst.get() + kBytes / 2, src.get() + kBytes / 2, kBytes / 2}};
    cuda::ce_copy_and_signal(s, copies, flag.get(), 7);
  });
  EXPECT_TRUE(ok) << "phase-2 copies + flag did not finish while every SM was held: they need SMs";
  uint32_t v = 0;
  FEPLB_CUDA_CHECK(cudaMemcpy(&v, flag.get(), 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(v, 7u);
}

TEST_F(SmFree, FlagWaitNeedsNoSm) {
  cuda::DeviceBuffer<char> src(kBytes), dst(kBytes);
  cuda::DeviceBuffer<uint32_t> flag(1);
  FEPLB_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  cuda::Stream writer;
  const bool ok = finishes_during_hog([&](cudaStream_t s) {
    cuda::stream_wait_u32_geq(s, flag.get(), 3);  // the consumer side of phase 2
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, s));
    cuda::ce_copy_and_signal(writer.get(), {}, flag.get(), 3);  // the producer side
  });
  EXPECT_TRUE(ok) << "flag wait + copy did not finish while every SM was held";
}

TEST_F(SmFree, InProcessTransportBatchCopiesRunOnCopyEngines) {
  cuda::InProcessGroup group(1);
  cuda::DeviceBuffer<char> src(kBytes), dst(kBytes);
  const bool ok = finishes_during_hog([&](cudaStream_t s) {
    const cuda::Chunk send{0, src.get(), kBytes}, recv{0, dst.get(), kBytes};
    group.endpoint(0).exchange({&send, 1}, {&recv, 1}, s);
  });
  EXPECT_TRUE(ok) << "the transport's batched copy did not finish while every SM was held";
}

TEST_F(SmFree, ControlSmCopyKernelWaitsForTheHog) {
  cuda::DeviceBuffer<char> src(kBytes), dst(kBytes);
  const bool ok = finishes_during_hog([&](cudaStream_t s) {
    FEPLB_CUDA_CHECK(cuda::kernels::sm_copy(src.get(), dst.get(), kBytes, 24, 0.0, s));
  });
  EXPECT_FALSE(ok) << "the SM copy kernel finished during the hog: the hog does not hold every SM";
}

}  // namespace
}  // namespace feplb
