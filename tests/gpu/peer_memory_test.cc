// Multi-process GPU tests (feplb_gpu_mp_tests): CUDA IPC peer memory between two processes (on
// one GPU or two), SM-free signals between them, and the NCCL transport with one process per GPU.
// Each test spawns this binary again as its ranks (torchrun-style environment, FEPLB_MP_CASE
// naming the rank's job); the parent never hangs: children get a deadline, then SIGKILL.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "feplb/core/error.h"
#include "feplb/cuda/check.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/peer_memory.h"
#include "feplb/cuda/resources.h"
#include "feplb/cuda/stream_ops.h"
#include "feplb/dist/launch.h"

extern char** environ;

namespace feplb::testing {
namespace {

constexpr double kRankTimeoutS = 30;  // every wait inside a rank
constexpr double kParentDeadlineS = 90;  // then the parent kills what is left

// Byte i of rank r's pattern in round k: a hash, so a misplaced or stale byte shows.
uint8_t pattern_byte(int rank, int round, size_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(round) << 40) ^ i;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

std::vector<uint8_t> pattern(int rank, int round, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = pattern_byte(rank, round, i);
  return v;
}

// First mismatching byte, or -1.
int64_t first_mismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// ---- the ranks (run in the spawned children) ---------------------------------------------------

cuda::AllGatherBlobs tcp_gather(const dist::LaunchEnv& env, double timeout_s) {
  return [env, timeout_s](const std::string& blob) { return dist::rendezvous_all_gather(env, blob, timeout_s); };
}

// Two processes: each pushes round k's pattern into the other's IPC-mapped buffer on the copy
// engine, raises the other's flag (slot 0 = data ready), waits for its own, reads what it got and
// acknowledges (slot 1), so the next round cannot overwrite data not yet read.
int rank_ipc_pair(const dist::LaunchEnv& env) {
  FEPLB_CUDA_CHECK(cudaSetDevice(env.local_rank));
  const int rank = env.rank, peer = 1 - rank, rounds = 3;
  const size_t bytes = (size_t{8} << 20) + 13, offset = 256;  // odd size, not at the allocation's start
  cuda::DeviceBuffer<uint8_t> recv_alloc(bytes + offset + 64), send(bytes);
  cuda::DeviceBuffer<uint32_t> flags(2);
  uint8_t* recv = recv_alloc.get() + offset;
  FEPLB_CUDA_CHECK(cudaMemset(recv_alloc.get(), 0, recv_alloc.bytes()));
  FEPLB_CUDA_CHECK(cudaMemset(flags.get(), 0, flags.bytes()));
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gather = tcp_gather(env, kRankTimeoutS);
  cuda::PeerMemory data(recv, bytes, rank, gather);
  cuda::PeerMemory flag_mem(flags.get(), flags.bytes(), rank, gather);
  if (data.peer_bytes(peer) != bytes) throw Error(fmt::format("peer announced {} bytes", data.peer_bytes(peer)));
  auto* peer_recv = static_cast<uint8_t*>(data.peer(peer));
  auto* peer_flags = static_cast<uint32_t*>(flag_mem.peer(peer));
  cuda::Stream s;
  std::vector<uint8_t> got(bytes);
  for (int k = 1; k <= rounds; ++k) {
    const auto mine = pattern(rank, k, bytes);
    FEPLB_CUDA_CHECK(cudaMemcpy(send.get(), mine.data(), bytes, cudaMemcpyHostToDevice));
    if (k > 1) cuda::stream_wait_u32_geq(s.get(), flags.get() + 1, static_cast<uint32_t>(k - 1));
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(peer_recv, send.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
    cuda::stream_write_u32(s.get(), peer_flags + 0, static_cast<uint32_t>(k));
    cuda::stream_wait_u32_geq(s.get(), flags.get() + 0, static_cast<uint32_t>(k));
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(got.data(), recv, bytes, cudaMemcpyDeviceToHost, s.get()));
    cuda::stream_write_u32(s.get(), peer_flags + 1, static_cast<uint32_t>(k));
    cuda::sync_with_timeout(s.get(), kRankTimeoutS, "ipc pair round");
    const int64_t bad = first_mismatch(got, pattern(peer, k, bytes));
    if (bad >= 0) {
      std::fprintf(stderr, "rank %d round %d: byte %lld is %d, expected %d\n", rank, k, static_cast<long long>(bad),
                   got[bad], pattern_byte(peer, k, static_cast<size_t>(bad)));
      return 1;
    }
  }
  // The guard bytes around the registered range are untouched.
  std::vector<uint8_t> guard(offset);
  FEPLB_CUDA_CHECK(cudaMemcpy(guard.data(), recv_alloc.get(), offset, cudaMemcpyDeviceToHost));
  for (uint8_t b : guard) {
    if (b != 0) {
      std::fprintf(stderr, "rank %d: a write landed before the registered range\n", rank);
      return 1;
    }
  }
  gather("done");  // nobody frees its buffer while the other may still copy into it
  std::printf("rank %d: %d rounds of %zu bytes over IPC (%s -> %s) ok\n", rank, rounds, bytes,
              data.location(rank).pci_bus_id.c_str(), data.location(peer).pci_bus_id.c_str());
  return 0;
}

// One process per GPU through NcclCommunicator: peer copies into registered buffers, signals,
// all_gather_i32 and exchange, checked bit for bit.
int rank_nccl_transport(const dist::LaunchEnv& env) {
  cuda::NcclCommunicator comm(env, kRankTimeoutS);
  const auto t = comm.transport();
  const int rank = t->rank(), world = t->world_size();
  if (!t->supports_peer_copies()) throw Error("supports_peer_copies() is false on a multi-GPU node");
  const size_t chunk = (size_t{1} << 20) + 48;
  cuda::DeviceBuffer<uint8_t> recv(chunk * world), send(chunk);
  FEPLB_CUDA_CHECK(cudaMemset(recv.get(), 0, recv.bytes()));
  const auto mine = pattern(rank, 1, chunk);
  FEPLB_CUDA_CHECK(cudaMemcpy(send.get(), mine.data(), chunk, cudaMemcpyHostToDevice));
  t->register_buffer("recv", recv.get(), recv.bytes());
  const auto signals = t->make_signals("ready", world);  // slot q: rank q's data landed here
  cuda::Stream s;
  // Phase-2 style: CE copy into every peer's slot [rank], then raise that peer's slot [rank].
  for (int p = 0; p < world; ++p) {
    auto* dst = static_cast<uint8_t*>(t->peer_buffer("recv", p)) + chunk * rank;
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(dst, send.get(), chunk, cudaMemcpyDeviceToDevice, s.get()));
    signals->signal(p, rank, 1, s.get());
  }
  for (int q = 0; q < world; ++q) signals->wait(q, 1, s.get());
  std::vector<uint8_t> got(recv.bytes());
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(got.data(), recv.get(), recv.bytes(), cudaMemcpyDeviceToHost, s.get()));
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "peer copies and signals");
  for (int q = 0; q < world; ++q) {
    const std::vector<uint8_t> part(got.begin() + static_cast<int64_t>(chunk * q),
                                    got.begin() + static_cast<int64_t>(chunk * (q + 1)));
    const int64_t bad = first_mismatch(part, pattern(q, 1, chunk));
    if (bad >= 0) {
      std::fprintf(stderr, "rank %d: chunk from rank %d differs at byte %lld\n", rank, q, static_cast<long long>(bad));
      return 1;
    }
  }
  // all_gather_i32.
  cuda::DeviceBuffer<int32_t> one(3), all(3 * static_cast<size_t>(world));
  const std::vector<int32_t> three{rank, 10 * rank, -rank};
  FEPLB_CUDA_CHECK(cudaMemcpy(one.get(), three.data(), one.bytes(), cudaMemcpyHostToDevice));
  t->all_gather_i32(one.get(), all.get(), 3, s.get());
  std::vector<int32_t> all_h(all.size());
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(all_h.data(), all.get(), all.bytes(), cudaMemcpyDeviceToHost, s.get()));
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "all_gather_i32");
  for (int q = 0; q < world; ++q) {
    if (all_h[3 * q] != q || all_h[3 * q + 1] != 10 * q || all_h[3 * q + 2] != -q) {
      std::fprintf(stderr, "rank %d: all_gather_i32 wrong for rank %d\n", rank, q);
      return 1;
    }
  }
  // exchange: rank r sends (r + p) % 3 * 1000 + 16 bytes to p (zero-byte chunks when r == p).
  auto size_of = [](int from, int to) -> size_t { return from == to ? 0 : static_cast<size_t>((from + to) % 3) * 1000 + 16; };
  cuda::DeviceBuffer<uint8_t> xs(size_t{4096} * world), xr(size_t{4096} * world);
  std::vector<uint8_t> xs_h(xs.size());
  std::vector<cuda::Chunk> sends, recvs;
  for (int p = 0; p < world; ++p) {
    for (size_t i = 0; i < size_of(rank, p); ++i) xs_h[4096 * p + i] = pattern_byte(rank, 100 + p, i);
    sends.push_back({p, xs.get() + 4096 * p, size_of(rank, p)});
    recvs.push_back({p, xr.get() + 4096 * p, size_of(p, rank)});
  }
  FEPLB_CUDA_CHECK(cudaMemcpy(xs.get(), xs_h.data(), xs.bytes(), cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemset(xr.get(), 0, xr.bytes()));
  t->exchange(sends, recvs, s.get());
  std::vector<uint8_t> xr_h(xr.size());
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(xr_h.data(), xr.get(), xr.bytes(), cudaMemcpyDeviceToHost, s.get()));
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "exchange");
  for (int p = 0; p < world; ++p) {
    for (size_t i = 0; i < size_of(p, rank); ++i) {
      if (xr_h[4096 * p + i] != pattern_byte(p, 100 + rank, i)) {
        std::fprintf(stderr, "rank %d: exchange from %d differs at byte %zu\n", rank, p, i);
        return 1;
      }
    }
  }
  // Nobody tears down (closing IPC mappings, freeing buffers) before everyone is done.
  t->all_gather_i32(one.get(), all.get(), 3, s.get());
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "final barrier");
  std::printf("rank %d of %d: peer copies, signals, all_gather_i32, exchange ok\n", rank, world);
  return 0;
}

int run_rank(const std::string& which) {
  try {
    const dist::LaunchEnv env = dist::launch_env_from_process();
    if (which == "rendezvous") {  // the harness itself, no GPU: every rank sees every rank
      const auto all = dist::rendezvous_all_gather(env, std::to_string(env.rank), kRankTimeoutS);
      for (int r = 0; r < env.world_size; ++r) {
        if (all[r] != std::to_string(r)) return 1;
      }
      return 0;
    }
    if (which == "ipc_pair") return rank_ipc_pair(env);
    if (which == "nccl_transport") return rank_nccl_transport(env);
    std::fprintf(stderr, "unknown FEPLB_MP_CASE '%s'\n", which.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
  }
  return 1;
}

// ---- the parent: spawn ranks, bound the wait, collect logs -------------------------------------

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw Error("free_port: no port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

struct RankOutcome {
  int exit_code = -1;  // -1: killed at the deadline or by a signal
  std::string log;
};

// Starts `world` copies of this binary as ranks of `which`; rank r sees LOCAL_RANK local_rank[r].
std::vector<RankOutcome> run_ranks(const std::string& which, int world, const std::vector<int>& local_rank,
                                   double deadline_s = kParentDeadlineS) {
  const int port = free_port();
  char tmpl[] = "/tmp/feplb_mp_XXXXXX";
  const std::string dir = mkdtemp(tmpl) ? tmpl : throw Error("mkdtemp failed");
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  std::vector<std::string> logs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" ||
          key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "FEPLB_MP_CASE") {
        continue;
      }
      env_s.push_back(kv);
    }
    const int local_world = *std::max_element(local_rank.begin(), local_rank.end()) + 1;
    env_s.push_back("FEPLB_MP_CASE=" + which);
    env_s.push_back(fmt::format("RANK={}", r));
    env_s.push_back(fmt::format("WORLD_SIZE={}", world));
    env_s.push_back(fmt::format("LOCAL_RANK={}", local_rank[r]));
    env_s.push_back(fmt::format("LOCAL_WORLD_SIZE={}", local_world));
    env_s.push_back("MASTER_ADDR=127.0.0.1");
    env_s.push_back(fmt::format("MASTER_PORT={}", port));
    std::vector<char*> envp;
    for (auto& kv : env_s) envp.push_back(kv.data());
    envp.push_back(nullptr);
    logs.push_back(fmt::format("{}/rank{}.log", dir, r));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    const int rc = posix_spawn(&pids[r], "/proc/self/exe", &fa, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGKILL);
      }
      throw Error(fmt::format("posix_spawn: {}", std::strerror(rc)));
    }
  }
  std::vector<RankOutcome> out(static_cast<size_t>(world));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        out[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] <= 0) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        out[r].log = fmt::format("(killed after the {:.0f} s deadline)\n", deadline_s);
        pids[r] = -1;
      }
      left = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream f(logs[r]);
    std::stringstream ss;
    ss << f.rdbuf();
    out[r].log += ss.str();
    std::remove(logs[r].c_str());
  }
  ::rmdir(dir.c_str());
  return out;
}

void expect_all_passed(const std::vector<RankOutcome>& out) {
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << " log:\n" << out[r].log;
    if (out[r].exit_code == 0) std::printf("%s", out[r].log.c_str());
  }
}

int visible_gpus(std::string* why) { return static_cast<int>(list_devices(why).size()); }

// The harness (spawn, environment, rendezvous, deadline) works without a GPU.
TEST(MpHarness, SpawnedRanksRendezvous) { expect_all_passed(run_ranks("rendezvous", 3, {0, 0, 0})); }

TEST(MpHarness, AFailingRankIsReportedWithItsLog) {
  const auto out = run_ranks("no-such-case", 2, {0, 0});
  for (const auto& o : out) {
    EXPECT_EQ(o.exit_code, 1);
    EXPECT_NE(o.log.find("unknown FEPLB_MP_CASE"), std::string::npos) << o.log;
  }
}

// Two processes on one GPU (or on GPUs 0 and 1 when there are two): IPC export/import, CE copies
// into the peer's buffer, stream-memory signals into the peer's flag.
TEST(PeerMemoryMp, TwoProcessesCopyAndSignalThroughIpc) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus == 0) GTEST_SKIP() << "no GPU: " << why;
  expect_all_passed(run_ranks("ipc_pair", 2, {0, 0}));
}

TEST(PeerMemoryMp, TwoProcessesOnTwoGpus) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible" << (gpus ? "" : ": " + why);
  expect_all_passed(run_ranks("ipc_pair", 2, {0, 1}));
}

// A peer that never arrives is an Error within the timeout, on rank 0 and on the others.
TEST(PeerMemoryMp, APeerThatNeverArrivesIsAnErrorNotAHang) {
  std::string why;
  if (visible_gpus(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  FEPLB_CUDA_CHECK(cudaSetDevice(0));
  cuda::DeviceBuffer<uint8_t> buf(4096);
  for (int rank : {0, 1}) {
    dist::LaunchEnv env;
    env.rank = rank;
    env.world_size = 2;
    env.master_port = free_port();
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      cuda::PeerMemory mem(buf.get(), buf.bytes(), rank, tcp_gather(env, 1.0));
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "rank " << rank;
    EXPECT_NE(what.find("rendezvous"), std::string::npos) << "rank " << rank << ": " << what;
  }
}

// The NCCL transport, one process per visible GPU (2..N).
TEST(NcclTransportMp, PeerCopiesSignalsAndCollectivesOnEveryGpu) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus < 2) {
    GTEST_SKIP() << "needs at least 2 GPUs (NCCL refuses two ranks on one GPU), " << gpus << " visible"
                 << (gpus ? "" : ": " + why);
  }
  std::vector<int> local(static_cast<size_t>(gpus));
  for (int g = 0; g < gpus; ++g) local[g] = g;
  expect_all_passed(run_ranks("nccl_transport", gpus, local));
}

}  // namespace
}  // namespace feplb::testing

int main(int argc, char** argv) {
  if (const char* which = std::getenv("FEPLB_MP_CASE")) return feplb::testing::run_rank(which);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
