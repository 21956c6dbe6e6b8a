// Signal sets between the processes of one host (Transport::Signals for one process per GPU; the
// NCCL transport's make_signals is this over the communicator's all-gather). Three mechanisms
// (SignalMechanism, feplb/cuda/transport.h), all free of SMs:
//
// kEvent (the default). Each rank creates, for every (receiving rank, slot), a small ring of CUDA
// interprocess events (cudaEventInterprocess | cudaEventDisableTiming); the handles are
// all-gathered and every rank opens those addressed to it (cudaIpcOpenEventHandle; a rank of the
// same process uses the event itself). signal(peer, slot, v, s) records ring entry v % ring on
// `s` and then publishes v as that entry's "recorded value" in a counter that every rank maps
// (POSIX shared memory, created by rank 0, unlinked once every rank has mapped it).
// wait(slot, v, s) spins on the host until some entry of the slot holds a recorded value >= v,
// takes the smallest such entry and enqueues cudaStreamWaitEvent on it: cudaStreamWaitEvent
// waits for the record that was current when it was called, so the host must call it after the
// signaller's host recorded. The spin is bounded by the set's timeout (an Error naming the rank,
// the set, the slot and who last signalled it). What holds: everything enqueued on the
// signaller's stream before signal() (copy-engine copies into any GPU's memory included) is
// complete and visible to the work enqueued on the waiter's stream after wait(): CUDA's event
// semantics, across streams, GPUs and processes. What the caller must keep: a slot's values only
// grow; the signaller's host does not run kSignalRing values ahead of a waiter's host on one slot
// (a record of v + kSignalRing replaces v's, and the waiter then waits for the later record:
// still >= v, but a wait that the later record itself depends on would deadlock; the host
// bound turns that into an Error); all ranks on one host.
//
// kStreamMemop. A zeroed uint32 flag per slot per rank, mapped into every peer (CUDA IPC).
// signal: one cuStreamBatchMemOp of a system-scope memory barrier (CU_STREAM_MEM_OP_BARRIER,
// CU_STREAM_MEMORY_BARRIER_TYPE_SYS) and a 32-bit write of v into the peer's flag; wait:
// cuStreamWaitValue32(GEQ) on one's own flag, with CU_STREAM_WAIT_VALUE_FLUSH where the device
// reports CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES. What holds: the write follows the stream's
// prior work in stream order, and the waiter's later work starts only once the flag reached v.
// What does not: CUDA documents no ordering between the completion of a copy-engine copy into
// another GPU's memory and a later stream memory write reaching that GPU. Between two H200s over
// NVLink, a copy of 8 MiB + 13 bytes followed by a plain stream write (no barrier) let the flag
// arrive before the copy's last 13 bytes (the boundary suggests the copy ran in pieces, split at
// 8 MiB). The barrier is the strongest fence a stream memory operation offers; whether it closes
// that gap is for the two-GPU tests to show. CU_STREAM_WAIT_VALUE_FLUSH only makes remote writes
// that already reached the waiter's GPU visible to its later work, and few platforms report it;
// cuFlushGPUDirectRDMAWrites is a host call for writes from third-party devices (NICs) and has no
// place in a stream. A wait on a flag nobody writes never times out on the GPU: hosts bound
// it with sync_with_timeout.
//
// kCeFlag. The same flags and wait; signal writes v into a local staging word (per peer, slot and
// v % kSignalRing) with a stream memory write, then copies that word into the peer's flag with
// cudaMemcpyAsync on the same stream, so the flag leaves through the copy engine after the data
// copies before it, the way NCCL's copy-engine collectives raise their completion flags. What
// holds: stream order (the flag copy starts after the data copies completed). What does not: as for
// kStreamMemop, no documented guarantee that the data's writes reach the other GPU first; the tests
// decide.
//
// Collective construction: every rank calls it with the same name, count and mechanism (checked:
// a mismatch, a rank on another host, a failed shared-memory or IPC step is an Error on every
// rank). Waits and setup are bounded by `timeout_s`.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "feplb/cuda/transport.h"
#include "feplb/cuda/transport/peer_memory.h"

namespace feplb::cuda {

// Events per (receiving rank, slot) in kEvent sets: the signaller's host may run this many values
// minus one ahead of a waiter's host on one slot.
inline constexpr int kSignalRing = 4;

// A failed peer in one line, or empty (Transport::peer_failure).
using PeerFailure = std::function<std::string()>;

// `peer_failure` (may be empty): kEvent waits poll it about every millisecond and throw an Error
// with its text (the set, the slot, the value and the failed peer) as soon as it reports one.
std::unique_ptr<Transport::Signals> make_ipc_signals(const std::string& name, int count, int rank,
                                                     int world, const AllGatherBlobs& all_gather,
                                                     SignalMechanism mechanism, double timeout_s,
                                                     PeerFailure peer_failure = {});

}  // namespace feplb::cuda
