#include "feplb/cuda/transport/peer_memory.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <mutex>

#include "feplb/cuda/base/check.h"

namespace feplb::cuda {
namespace {

// What one rank sends: fixed size, copied bytewise (every rank runs the same binary).
struct Record {
  std::array<char, 8> magic{'F', 'E', 'P', 'L', 'B', 'P', 'M', '1'};
  int64_t pid = 0;
  int32_t device = 0;
  int32_t has_handle = 0;
  uint64_t bytes = 0;
  uint64_t offset = 0;   // of the buffer inside the exported allocation
  uint64_t address = 0;  // the buffer in the sender's address space (used by the same process)
  std::array<char, 32> pci_bus_id{};
  std::array<char, 256> host{};
  cudaIpcMemHandle_t handle{};
};

template <size_t N>
void put(std::array<char, N>& dst, const std::string& s) {
  FEPLB_CHECK(s.size() < N, "'{}' longer than {} characters", s, N - 1);
  std::memcpy(dst.data(), s.data(), s.size());
}

template <size_t N>
std::string get(const std::array<char, N>& src) {
  return std::string(src.data(), strnlen(src.data(), N));
}

std::string encode(const Record& r) {
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

Record decode(const std::string& blob, int from_rank) {
  Record r;
  FEPLB_CHECK(blob.size() == sizeof(Record),
              "peer memory: rank {} sent {} bytes, expected {} (another binary?)", from_rank,
              blob.size(), sizeof(Record));
  std::memcpy(&r, blob.data(), sizeof(r));
  FEPLB_CHECK(r.magic == Record{}.magic, "peer memory: rank {} sent a record without the magic",
              from_rank);
  return r;
}

Record record_here() {
  const PeerLocation here = this_location();
  Record r;
  r.pid = here.pid;
  r.device = here.device;
  put(r.pci_bus_id, here.pci_bus_id);
  put(r.host, here.host);
  return r;
}

PeerLocation location_of(const Record& r) {
  return PeerLocation{get(r.host), r.pid, r.device, get(r.pci_bus_id)};
}

std::vector<Record> gather(int rank, const AllGatherBlobs& all_gather, const Record& mine) {
  const std::vector<std::string> blobs = all_gather(encode(mine));
  FEPLB_CHECK(rank >= 0 && rank < static_cast<int>(blobs.size()),
              "peer memory: rank {} of {} blobs", rank, blobs.size());
  std::vector<Record> all;
  for (size_t p = 0; p < blobs.size(); ++p) all.push_back(decode(blobs[p], static_cast<int>(p)));
  return all;
}

// The allocation that holds `ptr` (IPC handles name whole allocations): its base.
void* allocation_base(void* ptr) {
  static PFN_cuMemGetAddressRange_v3020 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* f = nullptr;
    FEPLB_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q));
    FEPLB_CHECK(q == cudaDriverEntryPointSuccess && f, "driver has no cuMemGetAddressRange");
    fn = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(f);
  });
  CUdeviceptr base = 0;
  size_t size = 0;
  FEPLB_CU_CHECK(fn(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)));
  return reinterpret_cast<void*>(base);
}

}  // namespace

PeerLocation this_location() {
  PeerLocation l;
  std::array<char, 256> host{};
  FEPLB_CHECK(gethostname(host.data(), host.size() - 1) == 0, "gethostname failed");
  l.host = host.data();
  l.pid = static_cast<int64_t>(getpid());
  FEPLB_CUDA_CHECK(cudaGetDevice(&l.device));
  std::array<char, 32> bus{};
  FEPLB_CUDA_CHECK(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), l.device));
  l.pci_bus_id = bus.data();
  return l;
}

std::string peer_unreachable_reason(const PeerLocation& peer) {
  const PeerLocation here = this_location();
  if (peer.host != here.host)
    return fmt::format("on another host ({}, this is {})", peer.host, here.host);
  int peer_device = -1;
  const cudaError_t err = cudaDeviceGetByPCIBusId(&peer_device, peer.pci_bus_id.c_str());
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it
    return fmt::format("its GPU {} is not visible in this process (CUDA_VISIBLE_DEVICES?): {}",
                       peer.pci_bus_id, cudaGetErrorString(err));
  }
  if (peer_device == here.device) return {};
  int can = 0;
  FEPLB_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, here.device, peer_device));
  if (!can) {
    return fmt::format("GPU {} ({}) cannot access GPU {} ({}) peer to peer", here.device,
                       here.pci_bus_id, peer_device, peer.pci_bus_id);
  }
  const cudaError_t en = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (en == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // expected: clear it
  } else {
    FEPLB_CUDA_CHECK(en);
  }
  return {};
}

bool all_peers_reachable(int rank, const AllGatherBlobs& all_gather, std::string* why) {
  const std::vector<Record> all = gather(rank, all_gather, record_here());
  std::string mine;
  for (size_t p = 0; p < all.size() && mine.empty(); ++p) {
    if (static_cast<int>(p) == rank) continue;
    const std::string r = peer_unreachable_reason(location_of(all[p]));
    if (!r.empty()) mine = fmt::format("rank {} cannot address rank {}: {}", rank, p, r);
  }
  // Second round: everyone's verdict, so all ranks agree.
  const std::vector<std::string> verdicts = all_gather(mine);
  for (const std::string& v : verdicts) {
    if (!v.empty()) {
      if (why) *why = v;
      return false;
    }
  }
  return true;
}

PeerMemory::PeerMemory(void* ptr, size_t bytes, int rank, const AllGatherBlobs& all_gather)
    : rank_(rank) {
  FEPLB_CUDA_CHECK(cudaGetDevice(&device_));
  Record mine = record_here();
  mine.bytes = bytes;
  if (ptr) {
    void* base = allocation_base(ptr);
    mine.offset = static_cast<uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(base));
    FEPLB_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, base));
    mine.has_handle = 1;
    mine.address = reinterpret_cast<uintptr_t>(ptr);
  }
  const std::vector<Record> all = gather(rank, all_gather, mine);
  peers_.resize(all.size());
  try {
    for (size_t p = 0; p < all.size(); ++p) {
      Peer& peer = peers_[p];
      const Record& r = all[p];
      peer.where = location_of(r);
      peer.bytes = r.bytes;
      if (static_cast<int>(p) == rank) {
        peer.ptr = ptr;
        continue;
      }
      if (!r.has_handle) continue;  // an empty buffer
      const std::string why = peer_unreachable_reason(peer.where);
      FEPLB_CHECK(why.empty(), "peer memory: rank {} cannot address rank {}'s buffer: {}", rank, p,
                  why);
      if (r.pid == static_cast<int64_t>(getpid()) && peer.where.host == this_location().host) {
        // Same process (one process driving several GPUs): IPC cannot open its own handles, and
        // the raw pointer is valid here (peer access was enabled above).
        peer.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(r.address));
        continue;
      }
      void* base = nullptr;
      FEPLB_CUDA_CHECK(cudaIpcOpenMemHandle(&base, r.handle, cudaIpcMemLazyEnablePeerAccess));
      peer.opened_base = base;
      peer.ptr = static_cast<char*>(base) + r.offset;
    }
  } catch (...) {
    for (Peer& peer : peers_) {
      if (peer.opened_base) FEPLB_CUDA_WARN(cudaIpcCloseMemHandle(peer.opened_base));
    }
    throw;
  }
}

PeerMemory::~PeerMemory() {
  for (Peer& peer : peers_) {
    if (peer.opened_base) FEPLB_CUDA_WARN(cudaIpcCloseMemHandle(peer.opened_base));
  }
}

void* PeerMemory::peer(int p) const {
  FEPLB_CHECK(p >= 0 && p < world_size(), "peer memory: rank {} of {}", p, world_size());
  return peers_[p].ptr;
}

size_t PeerMemory::peer_bytes(int p) const {
  FEPLB_CHECK(p >= 0 && p < world_size(), "peer memory: rank {} of {}", p, world_size());
  return peers_[p].bytes;
}

const PeerLocation& PeerMemory::location(int p) const {
  FEPLB_CHECK(p >= 0 && p < world_size(), "peer memory: rank {} of {}", p, world_size());
  return peers_[p].where;
}

}  // namespace feplb::cuda
