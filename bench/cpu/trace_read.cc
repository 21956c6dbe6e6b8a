// Throughput and memory of the trace reader (docs/trace-format.md states the results).
//
//   feplb_trace_read_bench [--mib N] [--trace FILE] [--json OUT]
//
// Without --trace, writes a trace of about N MiB (default 200) to a temporary file: the bundled
// default trace's steps (EP=8, 128 experts, 4096 tokens per GPU, top-8) repeated under new step
// ids. Then runs itself in a fresh process (`--read FILE`) that reads it with read_trace and
// reports the wall time and the peak resident memory it added (VmHWM after - VmRSS before), so
// that nothing of the writer's memory is counted, and the CPU time it used (the process does
// nothing else), which a shared machine disturbs less than the wall time. Prints one JSON object
// (and writes it to --json).
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "feplb/core/file_output.h"
#include "feplb/core/trace_io.h"

#ifndef FEPLB_DATA_DIR
#define FEPLB_DATA_DIR "data"
#endif

namespace {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

// Child: read the trace, report.
int read_mode(const std::string& path) {
  const int64_t rss_before = status_bytes("VmRSS");
  const auto t0 = std::chrono::steady_clock::now();
  const feplb::Trace t = feplb::read_trace(path);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t peak = status_bytes("VmHWM");
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  const double cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  int64_t counts_bytes = 0;
  for (const feplb::RoutingStep& s : t.steps) {
    counts_bytes +=
        static_cast<int64_t>((s.counts.capacity() + s.expert_counts.capacity()) * sizeof(int64_t));
  }
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  const nlohmann::ordered_json out = {
      {"file_bytes", bytes},
      {"steps", t.steps.size()},
      {"read_seconds", seconds},
      {"mb_per_s", static_cast<double>(bytes) / 1e6 / seconds},
      {"cpu_seconds", cpu_seconds},
      {"mb_per_cpu_s", static_cast<double>(bytes) / 1e6 / cpu_seconds},
      {"rss_before_bytes", rss_before},
      {"peak_rss_bytes", peak},
      {"added_peak_bytes", peak - rss_before},
      {"added_peak_over_file", static_cast<double>(peak - rss_before) / static_cast<double>(bytes)},
      {"trace_counts_bytes", counts_bytes},
      {"trace_counts_over_file", static_cast<double>(counts_bytes) / static_cast<double>(bytes)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The heap grows 64 MiB at a time, so that reading a large trace faults in whole transparent huge
  // pages (feplb/core/internal/huge_page_heap.h): on a virtual machine a 4 KiB page fault costs
  // tens of microseconds, half of the read. The process's own choice; the library leaves it alone.
  ::mallopt(M_TOP_PAD, 64 << 20);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "--read") return read_mode(args[1]);
  int64_t mib = 200;
  std::string trace_path, json_out;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--mib") {
      mib = std::stoll(args[i + 1]);
    } else if (args[i] == "--trace") {
      trace_path = args[i + 1];
    } else if (args[i] == "--json") {
      json_out = args[i + 1];
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--trace FILE] [--json OUT]\n", argv[0]);
      return 2;
    }
  }
  std::string tmp;
  if (trace_path.empty()) {
    const feplb::Trace base =
        feplb::read_trace(std::string(FEPLB_DATA_DIR) + "/traces/default.json");
    const std::string one = feplb::format_trace(base);
    feplb::Trace t = base;
    t.steps.clear();
    const auto copies =
        static_cast<int64_t>(mib) * (1 << 20) / static_cast<int64_t>(one.size()) + 1;
    for (int64_t c = 0; c < copies; ++c) {
      for (const feplb::RoutingStep& s : base.steps) {
        feplb::RoutingStep x = s;
        x.step = s.step + c * 1000;
        t.steps.push_back(std::move(x));
      }
    }
    tmp = (std::filesystem::temp_directory_path() /
           ("feplb-trace-read-" + std::to_string(::getpid()) + ".json"))
              .string();
    feplb::write_file(tmp, feplb::format_trace(t), false);
    trace_path = tmp;
  }
  // The reader in a fresh process.
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/proc/self/exe", argv[0], "--read", trace_path.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(fds[1]);
  std::string result;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    result.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!tmp.empty()) std::filesystem::remove(tmp);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "trace_read: the reader failed\n");
    return 1;
  }
  std::fputs(result.c_str(), stdout);
  if (!json_out.empty()) feplb::write_file(json_out, result, true);
  return 0;
}
