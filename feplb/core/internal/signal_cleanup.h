// Output files and signals (private to feplb_core; file_output.cc): what a signal that ends the
// process during a commit must undo, recorded so that an async-signal-safe handler can undo it,
// and a guard that holds those signals back while a file-system step and its record change
// together.
#pragma once

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

namespace feplb::internal {

// What a signal that ends the process during a commit undoes: temporary files (and a new output
// already placed) to remove, a replaced file kept aside to put back. Fixed storage; a slot is
// claimed and published through a lock-free atomic (threads may commit at once), and the handler
// reads it with unlink and rename alone (async-signal-safe).
struct CleanupSlot {
  std::atomic<int> state{0};
  char path[PATH_MAX];
  char to[PATH_MAX];
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads slot states");
inline CleanupSlot cleanup_slots[64];

class SignalCleanup {
 public:
  enum State : int { kFree = 0, kUnlink = 1, kRestore = 2, kClaimed = 3 };
  static constexpr int kSlots = 64;
  using Slot = CleanupSlot;

  // A slot for `path` (kRestore: renamed back to `to`); -1 when every slot is taken (that path is
  // then left to the commit's own error handling).
  static int track(State state, const std::string& path, const std::string& to = {}) {
    if (path.size() >= sizeof(Slot::path) || to.size() >= sizeof(Slot::to)) return -1;
    for (int i = 0; i < kSlots; ++i) {
      Slot& s = slots_[i];
      int expected = kFree;
      if (!s.state.compare_exchange_strong(expected, kClaimed)) continue;
      std::memcpy(s.path, path.c_str(), path.size() + 1);
      std::memcpy(s.to, to.c_str(), to.size() + 1);
      s.state.store(state);
      return i;
    }
    return -1;
  }
  static void untrack(int& slot) {
    if (slot >= 0) slots_[slot].state.store(kFree);
    slot = -1;
  }
  // The tracked path's undo becomes `state` (kRestore -> kUnlink: the commit completed).
  static void set_state(int slot, State state) {
    if (slot >= 0) slots_[slot].state.store(state);
  }

  // Installs the handler for SIGINT, SIGTERM and SIGHUP where their disposition is the default
  // (a program with handlers of its own keeps them), for this object's life.
  SignalCleanup() {
    for (int i = 0; i < kSignals; ++i) {
      struct sigaction old {};
      if (::sigaction(kSignal[i], nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
          old.sa_handler != SIG_DFL) {
        continue;
      }
      struct sigaction sa {};
      sa.sa_handler = &SignalCleanup::on_signal;
      sigemptyset(&sa.sa_mask);
      installed_[i] = ::sigaction(kSignal[i], &sa, nullptr) == 0;
    }
  }
  ~SignalCleanup() {
    for (int i = 0; i < kSignals; ++i) {
      if (!installed_[i]) continue;
      struct sigaction sa {};
      sa.sa_handler = SIG_DFL;
      sigemptyset(&sa.sa_mask);
      ::sigaction(kSignal[i], &sa, nullptr);
    }
  }
  SignalCleanup(const SignalCleanup&) = delete;
  SignalCleanup& operator=(const SignalCleanup&) = delete;

 private:
  static constexpr int kSignals = 3;
  static constexpr int kSignal[kSignals] = {SIGINT, SIGTERM, SIGHUP};
  bool installed_[kSignals] = {};
  static constexpr CleanupSlot (&slots_)[kSlots] = cleanup_slots;

  // Puts the kept-aside files back, removes the rest, then ends the process with the signal.
  // (Renaming a kept-aside hard link onto the file it links to does nothing: it is then removed.)
  static void on_signal(int sig) {
    for (Slot& s : slots_) {
      if (s.state.load() == kRestore) {
        ::rename(s.path, s.to);
        ::unlink(s.path);
      }
    }
    for (Slot& s : slots_) {
      if (s.state.load() == kUnlink) ::unlink(s.path);
    }
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
};

// Holds SIGINT, SIGTERM and SIGHUP back from this thread for its life, so that a step and the
// record SignalCleanup's handler reads of it (a file made and tracked, an output placed and its
// undo) happen together: a signal in between left a temporary file, or one output placed and not
// undone. A signal that arrives meanwhile is delivered when the old mask is back. Held only around
// file-system calls that do not block for long (never around writing an output's content).
class SignalBlock {
 public:
  SignalBlock() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
    blocked_ = ::pthread_sigmask(SIG_BLOCK, &set, &old_) == 0;
  }
  ~SignalBlock() {
    if (blocked_) ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t old_;
  bool blocked_ = false;
};

}  // namespace feplb::internal
