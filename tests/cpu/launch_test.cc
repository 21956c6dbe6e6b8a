// Multi-process launch plumbing: torchrun/mpirun environments and the TCP rendezvous (ranks as
// threads on localhost), including peers that never arrive.
#include "feplb/dist/launch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
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

TEST(Rendezvous, AllGathersEveryRanksBlobInRankOrder) {
  const int world = 5, port = free_port();
  std::vector<std::vector<std::string>> got(world);
  std::vector<std::thread> ts;
  for (int r = world - 1; r >= 0; --r) {  // rank 0 last: the others must retry until it listens
    ts.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r;
      e.world_size = world;
      e.master_port = port;
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
      e.master_port = port;
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
  e.master_port = port;
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
  e.master_port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(rendezvous_all_gather(e, "x", 0.3), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

}  // namespace
}  // namespace feplb::dist
