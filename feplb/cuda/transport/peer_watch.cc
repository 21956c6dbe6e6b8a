#include "feplb/cuda/transport/peer_watch.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>

#include "feplb/core/error.h"

namespace feplb::cuda {

namespace {

// A process's state letter and start time (clock ticks since boot) from /proc/<pid>/stat; false
// when there is no such process.
bool read_stat(int64_t pid, char* state, uint64_t* start) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "re");
  if (!f) return false;
  std::array<char, 1024> buf{};
  const size_t n = std::fread(buf.data(), 1, buf.size() - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
  const char* p = std::strrchr(buf.data(), ')');
  if (!p) return false;
  ++p;
  // Field 3 is the state, field 22 the start time.
  unsigned long long st = 0;
  char s = 0;
  int field = 3;
  const char* q = p;
  while (*q == ' ') ++q;
  s = *q;
  while (field < 22 && *q) {
    while (*q && *q != ' ') ++q;
    while (*q == ' ') ++q;
    ++field;
  }
  if (field != 22 || std::sscanf(q, "%llu", &st) != 1) return false;
  *state = s;
  *start = st;
  return true;
}

struct Identity {
  std::array<char, 8> magic{'F', 'E', 'P', 'L', 'B', 'P', 'W', '1'};
  int32_t rank = 0;
  int32_t pad = 0;
  int64_t pid = 0;
  uint64_t start = 0;
  std::array<char, 256> host{};
};

}  // namespace

PeerWatch::PeerWatch(int rank, int world, const AllGatherBlobs& all_gather) {
  if (world <= 1) return;
  Identity mine;
  mine.rank = rank;
  mine.pid = static_cast<int64_t>(::getpid());
  char state = 0;
  if (!read_stat(mine.pid, &state, &mine.start)) mine.start = 0;  // no /proc: nothing is watched
  ::gethostname(mine.host.data(), mine.host.size() - 1);
  const std::vector<std::string> all =
      all_gather(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
  FEPLB_CHECK(static_cast<int>(all.size()) == world, "peer watch: {} ranks answered, expected {}",
              all.size(), world);
  for (int p = 0; p < world; ++p) {
    Identity id;
    FEPLB_CHECK(all[p].size() == sizeof(id), "peer watch: rank {} sent {} bytes (another binary?)",
                p, all[p].size());
    std::memcpy(&id, all[p].data(), sizeof(id));
    FEPLB_CHECK(id.magic == Identity{}.magic && id.rank == p,
                "peer watch: blob {} is not rank {}'s identity", p, p);
    if (p == rank || mine.start == 0 || id.start == 0 || id.host != mine.host) continue;
    uint64_t start = 0;
    // Visible here as the same process: watched. Otherwise (another PID namespace) not.
    if (read_stat(id.pid, &state, &start) && start == id.start)
      peers_.push_back({p, id.pid, id.start});
  }
}

std::string PeerWatch::dead_peer() const {
  for (const Peer& p : peers_) {
    char state = 0;
    uint64_t start = 0;
    if (!read_stat(p.pid, &state, &start) || start != p.start || state == 'Z' || state == 'X' ||
        state == 'x') {
      return fmt::format("rank {} (pid {}) exited", p.rank, p.pid);
    }
  }
  return {};
}

}  // namespace feplb::cuda
