// Multi-process launch plumbing: torchrun/mpirun environments, the TCP rendezvous (ranks as
// threads on localhost) on its own port (never MASTER_PORT), peers that never arrive, and sharing
// rank 0's id through an all-gather (the caller's or the rendezvous), with its error paths.
#include "feplb/dist/launch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <thread>

#include "feplb/core/error.h"

namespace feplb::dist {
namespace {

GetEnv env_of(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

TEST(LaunchEnv, TorchrunMpirunAndSingleProcess) {
  auto e = launch_env(env_of({{"RANK", "5"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "4"},
                              {"MASTER_ADDR", "node0"},
                              {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.rendezvous_port, 1235);  // MASTER_PORT + 1: torchrun's store holds MASTER_PORT
  EXPECT_EQ(rendezvous_port(e), 1235);
  e = launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 3);
  e = launch_env(env_of({}));
  EXPECT_EQ(e.world_size, 1);
  EXPECT_THROW(launch_env(env_of({{"RANK", "8"}, {"WORLD_SIZE", "8"}})), InputError);
  EXPECT_THROW(launch_env(env_of({{"RANK", "x"}, {"WORLD_SIZE", "8"}})), InputError);
  EXPECT_THROW(launch_env(env_of({{"RANK", "0"}})), InputError);
  EXPECT_THROW(launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}})),
               InputError);
}

TEST(LaunchEnv, RendezvousPortFromItsOwnVariableOrMasterPortPlusOne) {
  auto e = launch_env(env_of({{"RANK", "0"},
                              {"WORLD_SIZE", "2"},
                              {"MASTER_PORT", "29500"},
                              {"FEPLB_RENDEZVOUS_PORT", "40000"}}));
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(rendezvous_port(e), 40000);
  e = launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  EXPECT_EQ(rendezvous_port(e), 29501);
  LaunchEnv built;  // made in code: rendezvous_port 0 means MASTER_PORT + 1
  built.master_port = 1000;
  EXPECT_EQ(rendezvous_port(built), 1001);
  // MASTER_PORT 65535 has no + 1: FEPLB_RENDEZVOUS_PORT must be given, and is then used.
  try {
    launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65535"}}));
    ADD_FAILURE() << "no error";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("FEPLB_RENDEZVOUS_PORT"), std::string::npos)
        << err.what();
  }
  e = launch_env(env_of({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"MASTER_PORT", "65535"},
                         {"FEPLB_RENDEZVOUS_PORT", "2000"}}));
  EXPECT_EQ(rendezvous_port(e), 2000);
  EXPECT_THROW(
      launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"FEPLB_RENDEZVOUS_PORT", "0"}})),
      InputError);
}

// A listening socket on `port` (127.0.0.1 and every address), as torchrun's store holds
// MASTER_PORT on rank 0; -1 if the port is taken.
int listen_on(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s, 16) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// With MASTER_PORT held (by the launcher's store), ranks from a torchrun environment still meet:
// the rendezvous listens on MASTER_PORT + 1.
TEST(Rendezvous, NeverBindsTheLaunchersPort) {
  int master = -1, held = -1;
  for (int attempt = 0; attempt < 50 && held < 0; ++attempt) {
    master = free_port();
    if (master >= 65535) continue;
    const int next = listen_on(master + 1);  // the rendezvous port must be free
    if (next < 0) continue;
    ::close(next);
    held = listen_on(master);
  }
  ASSERT_GE(held, 0) << "no free pair of ports";
  const int world = 3;
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      try {
        const LaunchEnv e = launch_env(env_of({{"RANK", std::to_string(r)},
                                               {"WORLD_SIZE", std::to_string(world)},
                                               {"MASTER_ADDR", "127.0.0.1"},
                                               {"MASTER_PORT", std::to_string(master)}}));
        const auto all = rendezvous_all_gather(e, std::to_string(r), 10);
        if (all != std::vector<std::string>{"0", "1", "2"}) errors[r] = "wrong blobs";
      } catch (const Error& err) {
        errors[r] = err.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  ::close(held);
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Rendezvous, APortAlreadyTakenIsAnInputErrorNamingTheVariable) {
  int port = -1, held = -1;
  for (int attempt = 0; attempt < 50 && held < 0; ++attempt) held = listen_on(port = free_port());
  ASSERT_GE(held, 0);
  LaunchEnv e;
  e.world_size = 2;
  e.rendezvous_port = port;
  try {
    rendezvous_all_gather(e, "x", 1);
    ADD_FAILURE() << "no error";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what())
                  .find("FEPLB_RENDEZVOUS_PORT: cannot listen on port " + std::to_string(port)),
              std::string::npos)
        << err.what();
  }
  ::close(held);
}

TEST(Rendezvous, AllGathersEveryRanksBlobInRankOrder) {
  const int world = 5, port = free_port();
  std::vector<std::vector<std::string>> got(world);
  std::vector<std::thread> ts;
  for (int r = world - 1; r >= 0; --r) {  // rank 0 last: the others must retry until it listens
    ts.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r;
      e.world_size = world;
      e.rendezvous_port = port;
      got[r] = rendezvous_all_gather(
          e, std::string(static_cast<size_t>(r) * 1000, static_cast<char>('a' + r)), 10);
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(got[r].size(), static_cast<size_t>(world));
    for (int s = 0; s < world; ++s)
      EXPECT_EQ(got[r][s], std::string(static_cast<size_t>(s) * 1000, static_cast<char>('a' + s)));
  }
}

// Peer memory runs several rendezvous in a row on one port: each round must see only its own.
TEST(Rendezvous, BackToBackRoundsOnOnePort) {
  const int world = 4, port = free_port(), rounds = 20;
  std::vector<std::vector<std::string>> got(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r;
      e.world_size = world;
      e.rendezvous_port = port;
      try {
        for (int k = 0; k < rounds; ++k) {
          const auto all = rendezvous_all_gather(e, std::to_string(k * 100 + r), 10);
          for (int s = 0; s < world; ++s) {
            if (all[s] != std::to_string(k * 100 + s))
              got[r].push_back(fmt::format("round {} rank {}: {}", k, s, all[s]));
          }
        }
      } catch (const Error& err) {
        got[r].push_back(err.what());
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(got[r].empty()) << "rank " << r << ": " << got[r].front();
}

TEST(Rendezvous, APeerThatNeverArrivesIsNamedWithinTheTimeout) {
  const int port = free_port();
  LaunchEnv e;
  e.world_size = 3;
  e.rendezvous_port = port;
  std::thread one([&] {
    LaunchEnv e1 = e;
    e1.rank = 1;
    try {
      rendezvous_all_gather(e1, "x", 0.5);  // sees rank 0 give up as a closed connection
    } catch (const Error&) {
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    rendezvous_all_gather(e, "0", 0.5);
  } catch (const Error& err) {
    what = err.what();
  }
  one.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_NE(what.find("rank(s) 2 never connected"), std::string::npos) << what;
}

TEST(Rendezvous, NoRankZeroIsAnErrorNotAHang) {
  LaunchEnv e;
  e.rank = 1;
  e.world_size = 2;
  e.rendezvous_port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(rendezvous_all_gather(e, "x", 0.3), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// ---- share_from_rank0: rank 0's id through an all-gather -------------------------------------

constexpr char kWhat[] = "test-id";
const std::string kId(128, '\x7f');  // an ncclUniqueId's size

// What `rank` passes to the all-gather (captured from a call whose all-gather gives up).
std::string entry_of(int rank, int world, const std::string& root = "") {
  std::string got;
  try {
    share_from_rank0(kWhat, rank, world, rank == 0 ? root : "", root.empty() ? 0 : root.size(),
                     [&](const std::string& mine) -> std::vector<std::string> {
                       got = mine;
                       throw std::runtime_error("captured");
                     });
  } catch (const Error&) {
  }
  return got;
}

// The error share_from_rank0 throws on `rank` when the all-gather returns `all`.
std::string error_with(int rank, int world, std::vector<std::string> all) {
  try {
    share_from_rank0(kWhat, rank, world, rank == 0 ? kId : "", kId.size(),
                     [&](const std::string&) { return all; });
  } catch (const InputError& e) {
    return std::string("InputError: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShareFromRank0, EveryRankGetsRankZerosIdThroughTheRendezvous) {
  const int world = 4, port = free_port();
  std::vector<std::string> got(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r;
      e.world_size = world;
      e.rendezvous_port = port;
      got[r] =
          share_from_rank0(kWhat, r, world, r == 0 ? kId : "", kId.size(), tcp_all_gather(e, 10));
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], kId) << "rank " << r;
  // One rank: the caller's all-gather of one entry.
  EXPECT_EQ(share_from_rank0(kWhat, 0, 1, kId, kId.size(),
                             [](const std::string& b) { return std::vector{b}; }),
            kId);
}

TEST(ShareFromRank0, APeerThatNeverAnswersIsAnErrorWithinTheTimeout) {
  LaunchEnv e;
  e.world_size = 3;
  e.rendezvous_port = free_port();
  std::thread one([&] {  // rank 1 arrives, rank 2 never does
    LaunchEnv e1 = e;
    e1.rank = 1;
    try {
      share_from_rank0(kWhat, 1, 3, "", kId.size(), tcp_all_gather(e1, 0.5));
    } catch (const Error&) {
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    share_from_rank0(kWhat, 0, 3, kId, kId.size(), tcp_all_gather(e, 0.5));
  } catch (const Error& err) {
    what = err.what();
  }
  one.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_NE(what.find("test-id: the all-gather failed on rank 0 of 3"), std::string::npos) << what;
  EXPECT_NE(what.find("rank(s) 2 never connected"), std::string::npos) << what;
}

TEST(ShareFromRank0, AnAllGatherThatThrowsIsAnErrorKeepingItsMessage) {
  try {
    share_from_rank0(kWhat, 1, 2, "", kId.size(),
                     [](const std::string&) -> std::vector<std::string> {
                       throw std::runtime_error("process group timed out");
                     });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "test-id: the all-gather failed on rank 1 of 2: process group timed out");
  }
}

TEST(ShareFromRank0, WrongEntriesAreErrorsNamingWhatIsWrong) {
  const std::string e0 = entry_of(0, 2, kId), e1 = entry_of(1, 2);
  ASSERT_FALSE(e0.empty());
  ASSERT_FALSE(e1.empty());
  EXPECT_EQ(error_with(1, 2, {e0, e1}), "");  // the right entries
  EXPECT_NE(error_with(1, 2, {e0}).find("returned 1 entries on rank 1, expected one per rank (2)"),
            std::string::npos);
  // Out of rank order, or the same rank twice.
  EXPECT_NE(
      error_with(1, 2, {e1, e0})
          .find("entry 0 of the all-gather on rank 1 is 'test-id 1 2', expected 'test-id 0 2'"),
      std::string::npos)
      << error_with(1, 2, {e1, e0});
  EXPECT_NE(error_with(0, 2, {e0, e0}).find("entry 1"), std::string::npos);
  // An entry from a group of another size, or made for another purpose.
  EXPECT_NE(error_with(1, 2, {e0, entry_of(1, 3)}).find("is 'test-id 1 3', expected 'test-id 1 2'"),
            std::string::npos);
  EXPECT_NE(error_with(1, 2, {"other 0 2\n" + kId, e1}).find("entry 0"), std::string::npos);
  // Rank 0's payload cut short.
  EXPECT_NE(error_with(1, 2, {e0.substr(0, e0.size() - 1), e1})
                .find("rank 0 sent 127 bytes, expected 128"),
            std::string::npos);
}

TEST(ShareFromRank0, BadArgumentsAreInputErrors) {
  const auto gather = [](const std::string& b) { return std::vector{b}; };
  EXPECT_THROW(share_from_rank0(kWhat, 2, 2, "", kId.size(), gather), InputError);
  EXPECT_THROW(share_from_rank0(kWhat, -1, 2, "", kId.size(), gather), InputError);
  EXPECT_THROW(share_from_rank0(kWhat, 0, 1, "short", kId.size(), gather), InputError);
  EXPECT_THROW(share_from_rank0(kWhat, 0, 1, kId, kId.size(), AllGatherBlobs()), InputError);
}

}  // namespace
}  // namespace feplb::dist
