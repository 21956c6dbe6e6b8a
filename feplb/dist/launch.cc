#include "feplb/dist/launch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "feplb/core/error.h"

namespace feplb::dist {
namespace {

using Clock = std::chrono::steady_clock;

int int_var(const GetEnv& getenv, const char* name, int fallback, int lo, int hi) {
  const char* v = getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  FEPLB_REQUIRE_INPUT(errno == 0 && end != v && *end == '\0' && x >= lo && x <= hi,
                      "{}: '{}' is not an integer in [{}, {}]", name, v, lo, hi);
  return static_cast<int>(x);
}

// A connected socket, closed on destruction.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Reads or writes exactly n bytes before the deadline.
void io_exact(int fd, void* buf, size_t n, bool write, Clock::time_point deadline,
              const std::string& what) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const double left = seconds_left(deadline);
    if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1) <= 0) {
      throw Error(fmt::format("rendezvous: timed out {} {}",
                              write ? "sending to" : "receiving from", what));
    }
    const ssize_t r = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (r <= 0) {
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      throw Error(fmt::format("rendezvous: connection to {} closed ({})", what,
                              r == 0 ? "EOF" : std::strerror(errno)));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void send_blob(int fd, const std::string& b, Clock::time_point deadline, const std::string& what) {
  uint64_t len = b.size();
  io_exact(fd, &len, sizeof(len), true, deadline, what);
  if (len) io_exact(fd, const_cast<char*>(b.data()), b.size(), true, deadline, what);
}

std::string recv_blob(int fd, Clock::time_point deadline, const std::string& what) {
  uint64_t len = 0;
  io_exact(fd, &len, sizeof(len), false, deadline, what);
  FEPLB_CHECK(len <= (uint64_t{1} << 30), "rendezvous: {} announced a {} byte blob", what, len);
  std::string b(len, '\0');
  if (len) io_exact(fd, b.data(), len, false, deadline, what);
  return b;
}

sockaddr_in resolve(const LaunchEnv& env) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &res);
  FEPLB_REQUIRE_INPUT(rc == 0 && res, "MASTER_ADDR: cannot resolve '{}' ({})", env.master_addr,
                      gai_strerror(rc));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(rendezvous_port(env)));
  return addr;
}

// One rank's entry in share_from_rank0: "<what> <rank> <world>\n" then, on rank 0, the payload.
std::string share_header(std::string_view what, int rank, int world_size) {
  return fmt::format("{} {} {}\n", what, rank, world_size);
}

}  // namespace

LaunchEnv launch_env(const GetEnv& getenv) {
  LaunchEnv e;
  const bool torchrun = getenv("RANK") || getenv("WORLD_SIZE");
  const bool mpi = getenv("OMPI_COMM_WORLD_RANK") != nullptr;
  const char* rank = torchrun ? "RANK" : "OMPI_COMM_WORLD_RANK";
  const char* world = torchrun ? "WORLD_SIZE" : "OMPI_COMM_WORLD_SIZE";
  const char* local = torchrun ? "LOCAL_RANK" : "OMPI_COMM_WORLD_LOCAL_RANK";
  const char* local_world = torchrun ? "LOCAL_WORLD_SIZE" : "OMPI_COMM_WORLD_LOCAL_SIZE";
  if (!torchrun && !mpi) return e;
  e.world_size = int_var(getenv, world, 0, 1, 1 << 20);
  FEPLB_REQUIRE_INPUT(getenv(world) != nullptr, "{}: missing (set with {})", world, rank);
  e.rank = int_var(getenv, rank, -1, 0, e.world_size - 1);
  FEPLB_REQUIRE_INPUT(getenv(rank) != nullptr, "{}: missing (set with {})", rank, world);
  e.local_world_size = int_var(getenv, local_world, e.world_size, 1, e.world_size);
  e.local_rank = int_var(getenv, local, e.rank % e.local_world_size, 0, e.local_world_size - 1);
  if (const char* a = getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = int_var(getenv, "MASTER_PORT", e.master_port, 1, 65535);
  FEPLB_REQUIRE_INPUT(
      getenv("FEPLB_RENDEZVOUS_PORT") || e.master_port < 65535,
      "FEPLB_RENDEZVOUS_PORT: not set, and its default MASTER_PORT + 1 = {} is no port",
      e.master_port + 1);
  e.rendezvous_port = int_var(getenv, "FEPLB_RENDEZVOUS_PORT", e.master_port + 1, 1, 65535);
  return e;
}

int rendezvous_port(const LaunchEnv& env) {
  return env.rendezvous_port > 0 ? env.rendezvous_port : env.master_port + 1;
}

LaunchEnv launch_env_from_process() {
  return launch_env([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

std::vector<std::string> rendezvous_all_gather(const LaunchEnv& env, const std::string& blob,
                                               double timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout_s));
  if (env.world_size == 1) return {blob};
  const sockaddr_in addr = resolve(env);
  const std::string master = fmt::format("{}:{}", env.master_addr, rendezvous_port(env));
  if (env.rank == 0) {
    Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
    FEPLB_CHECK(listener.get() >= 0, "socket: {}", std::strerror(errno));
    const int one = 1;
    ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in any = addr;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    FEPLB_REQUIRE_INPUT(
        ::bind(listener.get(), reinterpret_cast<const sockaddr*>(&any), sizeof(any)) == 0,
        "FEPLB_RENDEZVOUS_PORT: cannot listen on port {} ({}; the default is MASTER_PORT + 1)",
        rendezvous_port(env), std::strerror(errno));
    FEPLB_CHECK(::listen(listener.get(), 128) == 0, "listen: {}", std::strerror(errno));
    std::vector<std::string> blobs(static_cast<size_t>(env.world_size));
    std::vector<Fd> peers(static_cast<size_t>(env.world_size));
    blobs[0] = blob;
    int arrived = 1;
    while (arrived < env.world_size) {
      pollfd pfd{listener.get(), POLLIN, 0};
      const double left = seconds_left(deadline);
      if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1) <= 0) {
        std::string missing;
        for (int r = 1; r < env.world_size; ++r) {
          if (peers[r].get() < 0) missing += fmt::format("{}{}", missing.empty() ? "" : ",", r);
        }
        throw Error(fmt::format("rendezvous: rank(s) {} never connected to {} within {:.0f} s",
                                missing, master, timeout_s));
      }
      Fd c(::accept(listener.get(), nullptr, nullptr));
      if (c.get() < 0) continue;
      uint32_t r = 0;
      io_exact(c.get(), &r, sizeof(r), false, deadline, "a new peer");
      FEPLB_CHECK(r >= 1 && r < static_cast<uint32_t>(env.world_size) && peers[r].get() < 0,
                  "rendezvous: a peer claims rank {} (world {}), out of range or twice", r,
                  env.world_size);
      blobs[r] = recv_blob(c.get(), deadline, fmt::format("rank {}", r));
      peers[r] = std::move(c);
      ++arrived;
    }
    // Stop listening before anyone gets an answer: a peer that goes straight on to the next
    // rendezvous on this port is then refused (and retries) instead of landing in this
    // listener's backlog and being reset.
    listener = Fd();
    for (int r = 1; r < env.world_size; ++r) {
      for (const std::string& b : blobs)
        send_blob(peers[r].get(), b, deadline, fmt::format("rank {}", r));
    }
    return blobs;
  }
  // Other ranks: connect (rank 0 may not listen yet), send, receive everyone's.
  for (;;) {
    Fd s(::socket(AF_INET, SOCK_STREAM, 0));
    FEPLB_CHECK(s.get() >= 0, "socket: {}", std::strerror(errno));
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      const int one = 1;
      ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      uint32_t r = static_cast<uint32_t>(env.rank);
      io_exact(s.get(), &r, sizeof(r), true, deadline, "rank 0 at " + master);
      send_blob(s.get(), blob, deadline, "rank 0 at " + master);
      std::vector<std::string> blobs;
      for (int i = 0; i < env.world_size; ++i)
        blobs.push_back(recv_blob(s.get(), deadline, "rank 0 at " + master));
      return blobs;
    }
    if (seconds_left(deadline) <= 0) {
      throw Error(
          fmt::format("rendezvous: rank {} could not reach rank 0 at {} within {:.0f} s ({})",
                      env.rank, master, timeout_s, std::strerror(errno)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

AllGatherBlobs tcp_all_gather(const LaunchEnv& env, double timeout_s) {
  return [env, timeout_s](const std::string& blob) {
    return rendezvous_all_gather(env, blob, timeout_s);
  };
}

std::string share_from_rank0(std::string_view what, int rank, int world_size,
                             const std::string& root_blob, size_t expected_bytes,
                             const AllGatherBlobs& all_gather) {
  FEPLB_REQUIRE_INPUT(world_size >= 1 && rank >= 0 && rank < world_size,
                      "{}: rank {} is not in [0, {})", what, rank, world_size);
  FEPLB_REQUIRE_INPUT(rank != 0 || root_blob.size() == expected_bytes,
                      "{}: rank 0's blob is {} bytes, not {}", what, root_blob.size(),
                      expected_bytes);
  FEPLB_REQUIRE_INPUT(static_cast<bool>(all_gather), "{}: no all-gather function", what);
  std::vector<std::string> all;
  try {
    all =
        all_gather(share_header(what, rank, world_size) + (rank == 0 ? root_blob : std::string()));
  } catch (const InputError& e) {  // e.g. a rendezvous port that cannot be bound
    throw InputError(fmt::format("{}: the all-gather failed on rank {} of {}: {}", what, rank,
                                 world_size, e.what()));
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: the all-gather failed on rank {} of {}: {}", what, rank,
                            world_size, e.what()));
  }
  if (all.size() != static_cast<size_t>(world_size)) {
    throw Error(
        fmt::format("{}: the all-gather returned {} entries on rank {}, expected one per rank ({})",
                    what, all.size(), rank, world_size));
  }
  for (int r = 0; r < world_size; ++r) {
    const std::string header = share_header(what, r, world_size);
    const std::string& got = all[static_cast<size_t>(r)];
    if (got.compare(0, header.size(), header) != 0) {
      const std::string shown = got.substr(0, std::min(got.find('\n'), size_t{64}));
      throw Error(fmt::format(
          "{}: entry {} of the all-gather on rank {} is '{}', expected '{} {} {}' (every "
          "rank's blob, in rank order, from one group)",
          what, r, rank, shown, what, r, world_size));
    }
  }
  std::string payload = all[0].substr(share_header(what, 0, world_size).size());
  if (payload.size() != expected_bytes) {
    throw Error(
        fmt::format("{}: rank 0 sent {} bytes, expected {}", what, payload.size(), expected_bytes));
  }
  return payload;
}

}  // namespace feplb::dist
