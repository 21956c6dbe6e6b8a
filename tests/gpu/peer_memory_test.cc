// Multi-process GPU tests (feplb_gpu_mp_tests): CUDA IPC peer memory between two processes (on
// one GPU or two), SM-free signals between them (each SignalMechanism: copies of odd sizes at odd
// offsets, many rounds, both directions at once; a signal that never comes), the NCCL
// transport with one process per GPU, and a dying peer (a rank killed in the middle of a step:
// the survivor gets an Error naming it within its timeout and exits).
// Each test spawns this binary again as its ranks (torchrun-style environment, FEPLB_MP_CASE
// naming the rank's job); the parent never hangs: children get a deadline, then SIGKILL.
#include "feplb/cuda/transport/peer_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
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

#include "bench/harness/local_experts.h"
#include "feplb/core/error.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/runtime.h"
#include "feplb/cuda/transport/ipc_signals.h"
#include "feplb/cuda/transport/peer_watch.h"
#include "feplb/dist/launch.h"

extern char** environ;

namespace feplb::testing {
namespace {

constexpr double kRankTimeoutS = 30;     // every wait inside a rank
constexpr double kParentDeadlineS = 90;  // then the parent kills what is left

// Word w of rank r's pattern in round k: a hash, so a misplaced or stale byte shows.
uint64_t pattern_word(int rank, int round, uint64_t w) {
  uint64_t x = (static_cast<uint64_t>(rank) << 56) ^ (static_cast<uint64_t>(round) << 40) ^ w;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint8_t pattern_byte(int rank, int round, size_t i) {
  return static_cast<uint8_t>(pattern_word(rank, round, i / 8) >> (8 * (i % 8)));
}

void fill_pattern(uint8_t* out, int rank, int round, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t x = pattern_word(rank, round, i / 8);
    std::memcpy(out + i, &x, 8);
  }
  for (; i < bytes; ++i) out[i] = pattern_byte(rank, round, i);
}

std::vector<uint8_t> pattern(int rank, int round, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  fill_pattern(v.data(), rank, round, bytes);
  return v;
}

// First byte of got[0, bytes) that differs from rank's pattern of round k, or -1.
int64_t first_pattern_mismatch(const uint8_t* got, int rank, int round, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t x = pattern_word(rank, round, i / 8);
    if (std::memcmp(got + i, &x, 8) != 0) break;
  }
  for (; i < bytes; ++i) {
    if (got[i] != pattern_byte(rank, round, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// First mismatching byte, or -1.
int64_t first_mismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// "signals_stress:memop" -> kStreamMemop; no suffix: the default mechanism.
cuda::SignalMechanism mechanism_of(const std::string& which) {
  const size_t colon = which.find(':');
  return colon == std::string::npos ? cuda::kDefaultSignalMechanism
                                    : cuda::parse_signal_mechanism(which.substr(colon + 1));
}

// ---- the ranks (run in the spawned children) ---------------------------------------------------

cuda::AllGatherBlobs tcp_gather(const dist::LaunchEnv& env, double timeout_s) {
  return [env, timeout_s](const std::string& blob) {
    return dist::rendezvous_all_gather(env, blob, timeout_s);
  };
}

// Two processes: each pushes round k's pattern into the other's IPC-mapped buffer on the copy
// engine, signals the other (slot 0 = data ready; the default signal mechanism), waits for its
// own, reads what it got and acknowledges (slot 1), so the next round cannot overwrite data not
// yet read.
int rank_ipc_pair(const dist::LaunchEnv& env) {
  FEPLB_CUDA_CHECK(cudaSetDevice(env.local_rank));
  const int rank = env.rank, peer = 1 - rank, rounds = 3;
  const size_t bytes = (size_t{8} << 20) + 13,
               offset = 256;  // odd size, not at the allocation's start
  cuda::DeviceBuffer<uint8_t> recv_alloc(bytes + offset + 64), send(bytes);
  uint8_t* recv = recv_alloc.get() + offset;
  FEPLB_CUDA_CHECK(cudaMemset(recv_alloc.get(), 0, recv_alloc.bytes()));
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gather = tcp_gather(env, kRankTimeoutS);
  cuda::PeerMemory data(recv, bytes, rank, gather);
  const auto signals = cuda::make_ipc_signals("ipc_pair", 2, rank, 2, gather,
                                              cuda::kDefaultSignalMechanism, kRankTimeoutS);
  if (data.peer_bytes(peer) != bytes)
    throw Error(fmt::format("peer announced {} bytes", data.peer_bytes(peer)));
  auto* peer_recv = static_cast<uint8_t*>(data.peer(peer));
  cuda::Stream s;
  std::vector<uint8_t> got(bytes);
  for (int k = 1; k <= rounds; ++k) {
    const auto mine = pattern(rank, k, bytes);
    const auto v = static_cast<uint32_t>(k);
    FEPLB_CUDA_CHECK(cudaMemcpy(send.get(), mine.data(), bytes, cudaMemcpyHostToDevice));
    if (k > 1) signals->wait(1, v - 1, s.get());
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(peer_recv, send.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
    signals->signal(peer, 0, v, s.get());
    signals->wait(0, v, s.get());
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(got.data(), recv, bytes, cudaMemcpyDeviceToHost, s.get()));
    signals->signal(peer, 1, v, s.get());
    cuda::sync_with_timeout(s.get(), kRankTimeoutS, "ipc pair round");
    const int64_t bad = first_mismatch(got, pattern(peer, k, bytes));
    if (bad >= 0) {
      std::fprintf(stderr, "rank %d round %d: byte %lld is %d, expected %d\n", rank, k,
                   static_cast<long long>(bad), got[bad],
                   pattern_byte(peer, k, static_cast<size_t>(bad)));
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
  std::printf("rank %d: %d rounds of %zu bytes over IPC (%s -> %s), %s signals, ok\n", rank, rounds,
              bytes, data.location(rank).pci_bus_id.c_str(), data.location(peer).pci_bus_id.c_str(),
              std::string(cuda::signal_mechanism_name(signals->mechanism())).c_str());
  return 0;
}

// Copy sizes and offsets of the stress rounds: odd sizes around the copy engine's and the
// driver's boundaries (8 MiB + 13 is the copy whose tail a stream memory write once overtook
// between two GPUs), odd and aligned offsets; round k takes size k % 12 and offsets k % 7 and
// (k + 3) % 7, so 60 rounds meet every size at several offsets.
constexpr size_t kStressSizes[] = {
    (size_t{8} << 20) + 13, 1, 4095,  (size_t{64} << 20) + 7, 13, (size_t{1} << 20) + 3, 4097,
    (size_t{2} << 20) - 5,  3, 65535, (size_t{16} << 20) + 1, 511};
constexpr size_t kStressOffsets[] = {1, 4095, 256, 3, 65537, 257, 8191};
constexpr int kStressRounds = 60;
constexpr size_t kStressGuard = 64;

size_t stress_capacity() {
  return *std::max_element(std::begin(kStressSizes), std::end(kStressSizes)) +
         *std::max_element(std::begin(kStressOffsets), std::end(kStressOffsets)) + kStressGuard;
}

// Both ranks at once, kStressRounds rounds: push round k's pattern from an odd offset of `send`
// into the peer's buffer at an odd offset (copy engine), signal slot 0 of the peer, wait on one's
// own slot 0, copy what arrived to the host right behind the wait, acknowledge (slot 1; the peer
// waits for it before overwriting). Each round is checked bit for bit, then the guard bytes.
// `my_recv` (zeroed) and `peer_recv` are stress_capacity() bytes.
int copy_signal_rounds(int rank, int peer, cuda::Transport::Signals& signals, uint8_t* my_recv,
                       uint8_t* peer_recv, cudaStream_t s, const std::string& where) {
  const size_t capacity = stress_capacity();
  cuda::DeviceBuffer<uint8_t> send(capacity);
  cuda::PinnedBuffer<uint8_t> out(capacity), in(capacity);
  const std::string mech(cuda::signal_mechanism_name(signals.mechanism()));
  size_t total = 0;
  for (int k = 1; k <= kStressRounds; ++k) {
    const size_t bytes = kStressSizes[k % std::size(kStressSizes)];
    const size_t dst_off = kStressOffsets[k % std::size(kStressOffsets)];
    const size_t src_off = kStressOffsets[(k + 3) % std::size(kStressOffsets)];
    const auto v = static_cast<uint32_t>(k);
    fill_pattern(out.get(), rank, k, bytes);
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(send.get() + src_off, out.get(), bytes, cudaMemcpyHostToDevice, s));
    if (k > 1) signals.wait(1, v - 1, s);  // the peer has read round k - 1 out of its buffer
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(peer_recv + dst_off, send.get() + src_off, bytes,
                                     cudaMemcpyDeviceToDevice, s));
    signals.signal(peer, 0, v, s);
    signals.wait(0, v, s);
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(in.get(), my_recv + dst_off, bytes, cudaMemcpyDeviceToHost, s));
    signals.signal(peer, 1, v, s);
    cuda::sync_with_timeout(s, kRankTimeoutS, "copy and signal round");
    const int64_t bad = first_pattern_mismatch(in.get(), peer, k, bytes);
    if (bad >= 0) {
      size_t differ = 0;
      for (size_t i = static_cast<size_t>(bad); i < bytes; ++i) {
        differ += in.get()[i] != pattern_byte(peer, k, i);
      }
      std::fprintf(stderr,
                   "rank %d (%s, %s) round %d: copy of %zu bytes to offset %zu: byte %lld is %d, "
                   "expected %d; %zu of the %zu bytes from there on differ\n",
                   rank, where.c_str(), mech.c_str(), k, bytes, dst_off,
                   static_cast<long long>(bad), in.get()[bad],
                   pattern_byte(peer, k, static_cast<size_t>(bad)), differ,
                   bytes - static_cast<size_t>(bad));
      return 1;
    }
    total += bytes;
  }
  // Nothing landed outside [min offset, max offset + max size).
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(in.get(), my_recv, 1, cudaMemcpyDeviceToHost, s));
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(in.get() + 1, my_recv + capacity - kStressGuard, kStressGuard,
                                   cudaMemcpyDeviceToHost, s));
  cuda::sync_with_timeout(s, kRankTimeoutS, "guard bytes");
  for (size_t i = 0; i < 1 + kStressGuard; ++i) {
    if (in.get()[i] != 0) {
      std::fprintf(stderr, "rank %d (%s, %s): a copy wrote outside its range\n", rank,
                   where.c_str(), mech.c_str());
      return 1;
    }
  }
  std::printf("rank %d (%s, %s signals): %d rounds, %zu bytes each way, both ways at once, ok\n",
              rank, where.c_str(), mech.c_str(), kStressRounds, total);
  return 0;
}

// copy_signal_rounds between two processes (one GPU or two) over CUDA IPC and the TCP rendezvous.
int rank_signals_stress(const dist::LaunchEnv& env, cuda::SignalMechanism mechanism) {
  FEPLB_CUDA_CHECK(cudaSetDevice(env.local_rank));
  const int rank = env.rank, peer = 1 - rank;
  const size_t capacity = stress_capacity();
  cuda::DeviceBuffer<uint8_t> recv(capacity);
  FEPLB_CUDA_CHECK(cudaMemset(recv.get(), 0, recv.bytes()));
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gather = tcp_gather(env, kRankTimeoutS);
  cuda::PeerMemory data(recv.get(), recv.bytes(), rank, gather);
  const auto signals =
      cuda::make_ipc_signals("stress", 2, rank, 2, gather, mechanism, kRankTimeoutS);
  cuda::Stream s;
  const std::string where =
      fmt::format("IPC {} -> {}", data.location(rank).pci_bus_id, data.location(peer).pci_bus_id);
  const int rc = copy_signal_rounds(rank, peer, *signals, recv.get(),
                                    static_cast<uint8_t*>(data.peer(peer)), s.get(), where);
  gather(rc == 0 ? "done" : "failed");  // nobody unmaps or frees while the other may still copy
  return rc;
}

// copy_signal_rounds through the NCCL transport's register_buffer and make_signals, one process
// per GPU (ranks 0 and 1 of a two-rank communicator).
int rank_nccl_signals_stress(const dist::LaunchEnv& env, cuda::SignalMechanism mechanism) {
  cuda::NcclCommunicator comm(env, kRankTimeoutS);
  const auto t = comm.transport();
  const int rank = t->rank(), peer = 1 - rank;
  if (t->world_size() != 2) throw Error(fmt::format("needs 2 ranks, got {}", t->world_size()));
  if (!t->supports_peer_copies()) {
    throw Error("supports_peer_copies() is false on a multi-GPU node");
  }
  const size_t capacity = stress_capacity();
  cuda::DeviceBuffer<uint8_t> recv(capacity);
  FEPLB_CUDA_CHECK(cudaMemset(recv.get(), 0, recv.bytes()));
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  t->register_buffer("stress", recv.get(), recv.bytes());
  const auto signals = t->make_signals("stress", 2, mechanism);
  cuda::Stream s;
  const int rc = copy_signal_rounds(rank, peer, *signals, recv.get(),
                                    static_cast<uint8_t*>(t->peer_buffer("stress", peer)), s.get(),
                                    "NCCL transport");
  // Nobody tears down before everyone is done.
  cuda::DeviceBuffer<int32_t> one(1), all(2);
  FEPLB_CUDA_CHECK(cudaMemsetAsync(one.get(), 0, one.bytes(), s.get()));
  t->all_gather_i32(one.get(), all.get(), 1, s.get());
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "final barrier");
  return rc;
}

// Rank 0 waits on a slot rank 1 does not signal: an Error within the set's timeout on rank 0
// (the host wait for events; the bounded stream sync for the memory-operation mechanisms), never a
// hang. Then rank 1 signals after all, and the same wait goes through: the set still works.
int rank_signals_timeout(const dist::LaunchEnv& env, cuda::SignalMechanism mechanism) {
  FEPLB_CUDA_CHECK(cudaSetDevice(env.local_rank));
  constexpr double kTimeoutS = 2.0;
  const int rank = env.rank;
  const auto gather = tcp_gather(env, kRankTimeoutS);
  const auto signals = cuda::make_ipc_signals("timeout", 1, rank, 2, gather, mechanism, kTimeoutS);
  cuda::Stream s;
  if (rank == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      signals->wait(0, 1, s.get());
      cuda::sync_with_timeout(s.get(), kTimeoutS, "a wait for a signal that never comes");
    } catch (const Error& e) {
      what = e.what();
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0 (%s): after %.2f s: %s\n",
                std::string(cuda::signal_mechanism_name(mechanism)).c_str(), took, what.c_str());
    if (what.empty()) throw Error("a wait for a signal that never comes returned without an error");
    if (took < 0.9 * kTimeoutS || took > kTimeoutS + 3.0) {
      throw Error(
          fmt::format("the error came after {:.2f} s, the timeout is {} s", took, kTimeoutS));
    }
    if (mechanism == cuda::SignalMechanism::kEvent &&
        (what.find("slot 0") == std::string::npos ||
         what.find("no rank has signalled it") == std::string::npos ||
         what.find("'timeout'") == std::string::npos)) {
      throw Error("the error does not name the set, the slot and who signalled it: " + what);
    }
  }
  gather("timed out");  // rank 1 signals only once rank 0 has seen the error
  if (rank == 1) {
    signals->signal(0, 0, 1, s.get());
  } else if (mechanism == cuda::SignalMechanism::kEvent) {
    signals->wait(0, 1, s.get());  // (the memory-operation mechanisms' wait is still queued)
  }
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "the late signal");
  gather("done");
  return 0;
}

// Every rank makes a set that disagrees with rank 0's (rank 1 asks for one more slot): every rank
// gets the same one-line Error, quickly (without a GPU, every rank's own setup fails first, and
// they agree on that instead).
int rank_signals_mismatch(const dist::LaunchEnv& env, cuda::SignalMechanism mechanism) {
  if (cudaSetDevice(env.local_rank) != cudaSuccess)
    cudaGetLastError();  // no GPU: the set reports it
  const auto gather = tcp_gather(env, kRankTimeoutS);
  std::string what;
  try {
    cuda::make_ipc_signals("mismatch", 2 + env.rank, env.rank, env.world_size, gather, mechanism,
                           kRankTimeoutS);
  } catch (const Error& e) {
    what = e.what();
  }
  std::printf("rank %d: %s\n", env.rank, what.c_str());
  if (what.find("signal set 'mismatch'") == std::string::npos)
    throw Error("no error naming the set: " + what);
  const auto all = gather(what);
  for (size_t p = 0; p < all.size(); ++p) {
    if (all[p] != what) throw Error(fmt::format("rank {} got another error: {}", p, all[p]));
  }
  return 0;
}

// One process per GPU through NcclCommunicator: peer copies into registered buffers, signals,
// all_gather_i32 and exchange, checked bit for bit.
int rank_nccl_transport(const dist::LaunchEnv& env) {
  cuda::NcclCommunicator comm(env, kRankTimeoutS);
  const auto t = comm.transport();
  const int rank = t->rank(), world = t->world_size();
  if (!t->supports_peer_copies())
    throw Error("supports_peer_copies() is false on a multi-GPU node");
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
  FEPLB_CUDA_CHECK(
      cudaMemcpyAsync(got.data(), recv.get(), recv.bytes(), cudaMemcpyDeviceToHost, s.get()));
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "peer copies and signals");
  for (int q = 0; q < world; ++q) {
    const std::vector<uint8_t> part(got.begin() + static_cast<int64_t>(chunk * q),
                                    got.begin() + static_cast<int64_t>(chunk * (q + 1)));
    const int64_t bad = first_mismatch(part, pattern(q, 1, chunk));
    if (bad >= 0) {
      std::fprintf(stderr, "rank %d: chunk from rank %d differs at byte %lld\n", rank, q,
                   static_cast<long long>(bad));
      return 1;
    }
  }
  // all_gather_i32.
  cuda::DeviceBuffer<int32_t> one(3), all(3 * static_cast<size_t>(world));
  const std::vector<int32_t> three{rank, 10 * rank, -rank};
  FEPLB_CUDA_CHECK(cudaMemcpy(one.get(), three.data(), one.bytes(), cudaMemcpyHostToDevice));
  t->all_gather_i32(one.get(), all.get(), 3, s.get());
  std::vector<int32_t> all_h(all.size());
  FEPLB_CUDA_CHECK(
      cudaMemcpyAsync(all_h.data(), all.get(), all.bytes(), cudaMemcpyDeviceToHost, s.get()));
  cuda::sync_with_timeout(s.get(), kRankTimeoutS, "all_gather_i32");
  for (int q = 0; q < world; ++q) {
    if (all_h[3 * q] != q || all_h[3 * q + 1] != 10 * q || all_h[3 * q + 2] != -q) {
      std::fprintf(stderr, "rank %d: all_gather_i32 wrong for rank %d\n", rank, q);
      return 1;
    }
  }
  // exchange: rank r sends (r + p) % 3 * 1000 + 16 bytes to p (zero-byte chunks when r == p).
  auto size_of = [](int from, int to) -> size_t {
    return from == to ? 0 : static_cast<size_t>((from + to) % 3) * 1000 + 16;
  };
  cuda::DeviceBuffer<uint8_t> xs(size_t{4096} * world), xr(size_t{4096} * world);
  std::vector<uint8_t> xs_h(xs.size());
  std::vector<cuda::Chunk> sends, recvs;
  for (int p = 0; p < world; ++p) {
    for (size_t i = 0; i < size_of(rank, p); ++i)
      xs_h[4096 * p + i] = pattern_byte(rank, 100 + p, i);
    sends.push_back({p, xs.get() + 4096 * p, size_of(rank, p)});
    recvs.push_back({p, xr.get() + 4096 * p, size_of(p, rank)});
  }
  FEPLB_CUDA_CHECK(cudaMemcpy(xs.get(), xs_h.data(), xs.bytes(), cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemset(xr.get(), 0, xr.bytes()));
  t->exchange(sends, recvs, s.get());
  std::vector<uint8_t> xr_h(xr.size());
  FEPLB_CUDA_CHECK(
      cudaMemcpyAsync(xr_h.data(), xr.get(), xr.bytes(), cudaMemcpyDeviceToHost, s.get()));
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

// Rank 1 takes part in sharing NCCL's unique id through the all-gather, then leaves without
// joining NCCL: rank 0's non-blocking init must end in an Error within its 3 s timeout (the
// communicator aborted), never a hang. Both ranks on one GPU (only rank 0 initialises NCCL).
int rank_nccl_peer_never_joins(const dist::LaunchEnv& env) {
  const dist::AllGatherBlobs gather = dist::tcp_all_gather(env, kRankTimeoutS);
  if (env.rank == 1) {
    try {
      cuda::NcclCommunicator never(env.rank, env.world_size, env.local_rank,
                                   [&](const std::string& mine) -> std::vector<std::string> {
                                     gather(mine);  // rank 0 gets its entries
                                     throw Error("rank 1 leaves before NCCL init");
                                   });
    } catch (const Error&) {
      return 0;
    }
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    cuda::NcclCommunicator comm(env.rank, env.world_size, env.local_rank, gather, /*timeout_s=*/3);
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0 after %.1f s: %s\n", s, e.what());
    return std::string(e.what()).find("NCCL init") != std::string::npos && s < 30 ? 0 : 1;
  }
  std::fprintf(stderr, "rank 0: NCCL init succeeded without rank 1\n");
  return 1;
}

// ---- a dying peer ------------------------------------------------------------------------------

// What the survivor of a dying-peer case checks: an Error came, within half of `timeout_s` (the
// peer watch found the peer gone, not the timeout), naming rank `dead` as exited. 0 when so.
int survivor_verdict(const std::string& what, double took_s, double timeout_s, int dead) {
  std::printf("survivor: after %.3f s (timeout %.0f s): %s\n", took_s, timeout_s, what.c_str());
  int rc = 0;
  if (what.empty()) {
    std::fprintf(stderr, "survivor: no Error after the peer died\n");
    rc = 1;
  } else if (what.find(fmt::format("rank {}", dead)) == std::string::npos ||
             what.find("exited") == std::string::npos) {
    std::fprintf(stderr, "survivor: the Error does not name rank %d as exited: %s\n", dead,
                 what.c_str());
    rc = 1;
  }
  if (took_s > 0.5 * timeout_s) {
    std::fprintf(stderr, "survivor: the Error took %.2f s, more than half the %.0f s timeout\n",
                 took_s, timeout_s);
    rc = 1;
  }
  return rc;
}

// Leaves the survivor's process at once with `rc`: its streams may still wait on the dead peer's
// work, so no destructor runs (what a process that lost a peer does: abort, report, exit).
[[noreturn]] void leave(int rc) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}

// The peer watch alone (no GPU): rank 1 exits once both watch each other; rank 0 sees it named
// within 5 s, and saw nothing before.
int rank_peer_watch(const dist::LaunchEnv& env) {
  const auto gather = tcp_gather(env, kRankTimeoutS);
  const cuda::PeerWatch watch(env.rank, env.world_size, gather);
  if (watch.watched() != env.world_size - 1) {
    throw Error(fmt::format("rank {} watches {} peers, expected {}", env.rank, watch.watched(),
                            env.world_size - 1));
  }
  if (!watch.dead_peer().empty()) throw Error("a live peer reported dead: " + watch.dead_peer());
  gather("watching");
  if (env.rank == 1) leave(0);
  const auto t0 = std::chrono::steady_clock::now();
  std::string dead;
  while (dead.empty() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    dead = watch.dead_peer();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank 0 after %.3f s: %s\n", took, dead.c_str());
  return dead.find("rank 1 (pid ") != std::string::npos && dead.find("exited") != std::string::npos
             ? 0
             : 1;
}

// Copy-then-signal rounds between two processes on one GPU (the phase-2 pattern: copy into the
// peer's buffer, signal it, wait for its signal), signals of the default mechanism polling a peer
// watch. In round 3 rank 1 waits for rank 0's data, issues its own copy and is killed (SIGKILL)
// before it signals: rank 0, waiting for that signal, gets an Error naming rank 1 well within the
// set's timeout, then leaves.
int rank_dying_peer_signals(const dist::LaunchEnv& env) {
  FEPLB_CUDA_CHECK(cudaSetDevice(env.local_rank));
  constexpr double kTimeoutS = 20;
  constexpr int kDieAt = 3;
  const int rank = env.rank, peer = 1 - rank;
  const size_t bytes = (size_t{4} << 20) + 13;
  cuda::DeviceBuffer<uint8_t> recv(bytes), send(bytes);
  FEPLB_CUDA_CHECK(cudaMemset(recv.get(), 0, recv.bytes()));
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gather = tcp_gather(env, kRankTimeoutS);
  cuda::PeerMemory data(recv.get(), bytes, rank, gather);
  const cuda::PeerWatch watch(rank, 2, gather);
  if (watch.watched() != 1)
    throw Error(fmt::format("rank {} watches {} peers, expected 1", rank, watch.watched()));
  const auto signals =
      cuda::make_ipc_signals("dying", 2, rank, 2, gather, cuda::kDefaultSignalMechanism, kTimeoutS,
                             [&watch] { return watch.dead_peer(); });
  auto* peer_recv = static_cast<uint8_t*>(data.peer(peer));
  cuda::Stream s;
  cuda::PinnedBuffer<uint8_t> host(bytes);
  for (int k = 1; k <= kDieAt + 2; ++k) {
    const auto v = static_cast<uint32_t>(k);
    fill_pattern(host.get(), rank, k, bytes);
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(send.get(), host.get(), bytes, cudaMemcpyHostToDevice, s.get()));
    if (k > 1) signals->wait(1, v - 1, s.get());
    if (rank == 1 && k == kDieAt) {
      // Rank 0's data of this round is here (its copy into this process is done), then this
      // rank's copy is under way and the process dies before it signals.
      signals->wait(0, v, s.get());
      cuda::sync_with_timeout(s.get(), kRankTimeoutS, "rank 1 before dying");
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(peer_recv, send.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
      std::printf("rank 1: killed in the middle of round %d\n", k);
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    }
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(peer_recv, send.get(), bytes, cudaMemcpyDeviceToDevice, s.get()));
    signals->signal(peer, 0, v, s.get());
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      signals->wait(0, v, s.get());
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(host.get(), recv.get(), bytes, cudaMemcpyDeviceToHost, s.get()));
      signals->signal(peer, 1, v, s.get());
      cuda::sync_with_timeout(s.get(), kRankTimeoutS, "a round");
    } catch (const Error& e) {
      what = e.what();
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k < kDieAt) {
      if (!what.empty()) throw Error(fmt::format("round {} before the peer died: {}", k, what));
      const int64_t bad = first_pattern_mismatch(host.get(), peer, k, bytes);
      if (bad >= 0) throw Error(fmt::format("round {}: byte {} differs", k, bad));
      continue;
    }
    leave(survivor_verdict(what, took, kTimeoutS, peer));
  }
  std::fprintf(stderr, "rank %d: every round went through although rank 1 was killed\n", rank);
  return 1;
}

// A planner that kills its process (SIGKILL) when it is asked for plan number `die_at`: on the
// scheduler thread, after the counts all-gather, before phase 1. Otherwise the inner planner.
class DieInPlan final : public Planner {
 public:
  DieInPlan(const PlannerContext& ctx, std::unique_ptr<Planner> inner, int die_at)
      : Planner(ctx), inner_(std::move(inner)), die_at_(die_at) {}
  std::string_view name() const override { return inner_->name(); }
  PlanLimits limits() const override { return inner_->limits(); }
  void make_plan(const RoutingStep& routing, Plan& out) override {
    if (++plans_ == die_at_) {
      std::printf("killed while planning step %d\n", plans_);
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    }
    inner_->plan(routing, out);
  }
  void observe(const RoutingStep& routing) override { inner_->observe(routing); }
  std::span<const Copy> prefetch(int64_t layer) const override { return inner_->prefetch(layer); }

 private:
  std::unique_ptr<Planner> inner_;
  int die_at_, plans_ = 0;
};

// The layer over NCCL, one process per GPU: every token routes to rank 0's experts, so the feplb
// planner moves some of them to rank 1 (phase-2 copies and signals both ways). Rank 1 dies while
// planning step 3 (after the counts all-gather, before phase 1). Rank 0's forward or its bounded
// synchronize must throw an Error naming rank 1 within the runtime's timeout; rank 0 then aborts
// the communicator and leaves.
int rank_dying_peer_layer(const dist::LaunchEnv& env) {
  constexpr double kTimeoutS = 20;
  constexpr int kDieAt = 3;
  cuda::NcclCommunicator comm(env, kRankTimeoutS);
  const auto t = comm.transport();
  const int rank = t->rank(), world = t->world_size();
  if (world != 2) throw Error(fmt::format("needs 2 ranks, got {}", world));
  cuda::RuntimeConfig c;
  c.topo = Topology::contiguous(2, 2, 16);
  c.shape = ExpertShape{256, 128, Dtype::kBf16};
  c.max_top_k = 2;
  c.max_tokens = 256;
  c.training = false;
  c.timeout_s = kTimeoutS;
  c.name = "dying";
  // Tiny experts make every copy "slow" next to its GEMM: balance anyway (the mechanics matter).
  c.knobs.copy_timing = 0;
  c.knobs.min_slice_rows = 8;
  c.knobs.slice_align_rows = 8;
  c.knobs.tau = 0;
  c.knobs.balance_tolerance = 0;
  cuda::EpRuntime rt(c, *t);
  std::unique_ptr<Planner> planner = cuda::make_gpu_planner(rt, "feplb");
  if (rank == 1) {
    planner = std::make_unique<DieInPlan>(PlannerContext{c.topo, c.shape, c.knobs, nullptr},
                                          std::move(planner), kDieAt);
  }
  cuda::MoeLayer layer(rt, {2, "dying"}, std::move(planner));
  const int64_t S = c.max_tokens, K = 2, H = c.shape.hidden;
  cuda::LocalExperts experts(c.topo.experts_per_rank(), H, c.shape.ffn, /*grads=*/false);
  cuda::DeviceBuffer<__nv_bfloat16> x(static_cast<size_t>(S * H)), out(static_cast<size_t>(S * H));
  cuda::DeviceBuffer<int32_t> idx(static_cast<size_t>(S * K));
  cuda::DeviceBuffer<float> wt(static_cast<size_t>(S * K));
  FEPLB_CUDA_CHECK(
      cudaMemset(experts.weights(), 0, static_cast<size_t>(experts.weight_elems()) * 2));
  FEPLB_CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
  std::vector<int32_t> topk(static_cast<size_t>(S * K));
  std::vector<float> w(static_cast<size_t>(S * K), 0.5f);
  for (int64_t i = 0; i < S; ++i) {  // rank 0's experts 0..7 only
    topk[static_cast<size_t>(2 * i)] = static_cast<int32_t>(i % 8);
    topk[static_cast<size_t>(2 * i + 1)] =
        static_cast<int32_t>((i + 3) % 8 == i % 8 ? (i + 4) % 8 : (i + 3) % 8);
  }
  FEPLB_CUDA_CHECK(cudaMemcpy(idx.get(), topk.data(), idx.bytes(), cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemcpy(wt.get(), w.data(), wt.bytes(), cudaMemcpyHostToDevice));
  cuda::Stream s;
  for (int step = 1; step <= kDieAt + 2; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      layer.forward(experts.params(), x.get(), idx.get(), wt.get(), S, out.get(), s.get());
      rt.synchronize(s.get());
    } catch (const Error& e) {
      what = e.what();
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step < kDieAt) {
      if (!what.empty()) throw Error(fmt::format("step {} before the peer died: {}", step, what));
      if (layer.last_forward_stats().guest_rows + layer.last_forward_stats().exported_rows == 0) {
        throw Error(fmt::format("step {}: nothing migrated between the ranks", step));
      }
      continue;
    }
    const int rc = survivor_verdict(what, took, kTimeoutS, 1 - rank);
    std::fflush(stdout);
    // Abort the communicator (pending NCCL work returns), bounded: a hang there is its own failure.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(15));
      std::fprintf(stderr, "survivor: ncclCommAbort did not return within 15 s\n");
      leave(3);
    }).detach();
    comm.abort();
    leave(rc);
  }
  std::fprintf(stderr, "rank %d: every step went through although rank 1 was killed\n", rank);
  return 1;
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
    if (which == "nccl_peer_never_joins") return rank_nccl_peer_never_joins(env);
    if (which == "peer_watch") return rank_peer_watch(env);
    if (which == "dying_peer_signals") return rank_dying_peer_signals(env);
    if (which == "dying_peer_layer") return rank_dying_peer_layer(env);
    const std::string kind = which.substr(0, which.find(':'));
    if (kind == "signals_stress") return rank_signals_stress(env, mechanism_of(which));
    if (kind == "nccl_signals_stress") return rank_nccl_signals_stress(env, mechanism_of(which));
    if (kind == "signals_timeout") return rank_signals_timeout(env, mechanism_of(which));
    if (kind == "signals_mismatch") return rank_signals_mismatch(env, mechanism_of(which));
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
std::vector<RankOutcome> run_ranks(const std::string& which, int world,
                                   const std::vector<int>& local_rank,
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
      if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" ||
          key == "LOCAL_WORLD_SIZE" || key == "MASTER_ADDR" || key == "MASTER_PORT" ||
          key == "FEPLB_RENDEZVOUS_PORT" || key == "FEPLB_MP_CASE") {
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
    env_s.push_back(fmt::format("FEPLB_RENDEZVOUS_PORT={}", port));  // nothing else listens here
    std::vector<char*> envp;
    for (auto& kv : env_s) envp.push_back(kv.data());
    envp.push_back(nullptr);
    logs.push_back(fmt::format("{}/rank{}.log", dir, r));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
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
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
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
TEST(MpHarness, SpawnedRanksRendezvous) {
  expect_all_passed(run_ranks("rendezvous", 3, {0, 0, 0}));
}

TEST(MpHarness, AFailingRankIsReportedWithItsLog) {
  const auto out = run_ranks("no-such-case", 2, {0, 0});
  for (const auto& o : out) {
    EXPECT_EQ(o.exit_code, 1);
    EXPECT_NE(o.log.find("unknown FEPLB_MP_CASE"), std::string::npos) << o.log;
  }
}

// Two processes on one GPU, and on GPUs 0 and 1: IPC export/import, CE copies into the peer's
// buffer, signals of the default mechanism.
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
    env.rendezvous_port = free_port();
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

TEST(NcclBootstrapMp, APeerThatNeverJoinsNcclIsAnErrorWithinTheTimeout) {
  std::string why;
  if (visible_gpus(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  expect_all_passed(run_ranks("nccl_peer_never_joins", 2, {0, 0}, /*deadline_s=*/60));
}

TEST(SignalMechanism, NamesRoundTripAndAnUnknownNameIsAnInputError) {
  for (auto m : {cuda::SignalMechanism::kEvent, cuda::SignalMechanism::kStreamMemop,
                 cuda::SignalMechanism::kCeFlag}) {
    EXPECT_EQ(cuda::parse_signal_mechanism(cuda::signal_mechanism_name(m)), m);
  }
  EXPECT_EQ(cuda::kDefaultSignalMechanism, cuda::SignalMechanism::kEvent);
  EXPECT_THROW(cuda::parse_signal_mechanism("flag"), InputError);
}

// Each signal mechanism between two processes (make_ipc_signals over the TCP rendezvous, as the
// NCCL transport uses it over its all-gather).
class SignalsMp : public ::testing::TestWithParam<cuda::SignalMechanism> {
 protected:
  std::string rank_case(const std::string& kind) const {
    return kind + ":" + std::string(cuda::signal_mechanism_name(GetParam()));
  }
};

TEST_P(SignalsMp, OddCopiesManyRoundsBothWaysTwoProcessesOneGpu) {
  std::string why;
  if (visible_gpus(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  expect_all_passed(run_ranks(rank_case("signals_stress"), 2, {0, 0}, 240));
}

TEST_P(SignalsMp, OddCopiesManyRoundsBothWaysTwoGpus) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible" << (gpus ? "" : ": " + why);
  expect_all_passed(run_ranks(rank_case("signals_stress"), 2, {0, 1}, 240));
}

TEST_P(SignalsMp, OddCopiesManyRoundsBothWaysNcclTransportTwoGpus) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus < 2) {
    GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU), " << gpus << " visible"
                 << (gpus ? "" : ": " + why);
  }
  expect_all_passed(run_ranks(rank_case("nccl_signals_stress"), 2, {0, 1}, 240));
}

TEST_P(SignalsMp, ASignalThatNeverComesIsAnErrorOnTheWaiterNotAHang) {
  std::string why;
  if (visible_gpus(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  expect_all_passed(run_ranks(rank_case("signals_timeout"), 2, {0, 0}, 60));
}

// Runs without a GPU too: then every rank's own setup fails, and all report the same failure.
TEST_P(SignalsMp, RanksThatDisagreeGetTheSameErrorNotAHang) {
  const auto t0 = std::chrono::steady_clock::now();
  expect_all_passed(run_ranks(rank_case("signals_mismatch"), 2, {0, 0}, 60));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, SignalsMp,
                         ::testing::Values(cuda::SignalMechanism::kEvent,
                                           cuda::SignalMechanism::kStreamMemop,
                                           cuda::SignalMechanism::kCeFlag),
                         [](const ::testing::TestParamInfo<cuda::SignalMechanism>& p) {
                           std::string n(cuda::signal_mechanism_name(p.param));
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// The NCCL transport, one process per visible GPU (2..N).
TEST(NcclTransportMp, PeerCopiesSignalsAndCollectivesOnEveryGpu) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus < 2) {
    GTEST_SKIP() << "needs at least 2 GPUs (NCCL refuses two ranks on one GPU), " << gpus
                 << " visible" << (gpus ? "" : ": " + why);
  }
  std::vector<int> local(static_cast<size_t>(gpus));
  for (int g = 0; g < gpus; ++g) local[g] = g;
  expect_all_passed(run_ranks("nccl_transport", gpus, local));
}

// ---- a dying peer ----------------------------------------------------------------------------

// Checks a dying-peer case's outcome: rank `dead` was killed (no exit status), the survivor passed
// its checks (its log says how long the Error took and what it said), and the whole case took
// well under the parent's deadline.
void expect_survivor(const std::vector<RankOutcome>& out, int dead, double took_s) {
  const int survivor = 1 - dead;
  EXPECT_EQ(out[dead].exit_code, -1) << "rank " << dead << " was not killed:\n" << out[dead].log;
  EXPECT_EQ(out[survivor].exit_code, 0) << "rank " << survivor << " log:\n" << out[survivor].log;
  std::printf("%s", out[survivor].log.c_str());
  EXPECT_LT(took_s, 60.0) << "the survivor did not leave in time";
}

TEST(PeerWatchMp, ARankThatExitedIsNamed) {  // no GPU needed
  expect_all_passed(run_ranks("peer_watch", 2, {0, 0}, 60));
}

// Two processes on one GPU: the copy-then-signal pattern of phase 2, rank 1 killed in the middle
// of a round; rank 0's wait for its signal is an Error naming rank 1 within the timeout.
TEST(DyingPeerMp, ASignalWaiterGetsAnErrorNamingTheKilledRankOneGpu) {
  std::string why;
  if (visible_gpus(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = run_ranks("dying_peer_signals", 2, {0, 0}, 90);
  expect_survivor(out, 1,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The layer over NCCL, one process per GPU, rank 1 killed while planning a step (after the counts
// all-gather, before phase 1): rank 0's forward or synchronize is an Error naming rank 1 within
// the runtime's timeout, and rank 0 exits.
TEST(DyingPeerMp, TheLayerSurvivorGetsAnErrorNamingTheKilledRankTwoGpus) {
  std::string why;
  const int gpus = visible_gpus(&why);
  if (gpus < 2) {
    GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one GPU; the one-GPU case is "
                    "DyingPeerMp.ASignalWaiterGetsAnErrorNamingTheKilledRankOneGpu), "
                 << gpus << " visible" << (gpus ? "" : ": " + why);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = run_ranks("dying_peer_layer", 2, {0, 1}, 120);
  expect_survivor(out, 1,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace
}  // namespace feplb::testing

int main(int argc, char** argv) {
  if (const char* which = std::getenv("FEPLB_MP_CASE")) return feplb::testing::run_rank(which);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
