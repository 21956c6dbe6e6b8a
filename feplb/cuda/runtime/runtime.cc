#include "feplb/cuda/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>
#include <utility>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/runtime/runtime_state.h"

namespace feplb::cuda {
namespace {

// The runtime's own allocator for saved activations: a CUDA stream-ordered memory pool that keeps
// what it has reserved (release threshold: never), so a warm runtime allocates nothing from the
// driver per call.
class PoolAllocator final : public Allocator {
 public:
  PoolAllocator() {
    int device = 0;
    FEPLB_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    FEPLB_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    FEPLB_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  ~PoolAllocator() override { FEPLB_CUDA_WARN(cudaMemPoolDestroy(pool_)); }
  void* allocate(size_t bytes, cudaStream_t stream) override {
    void* p = nullptr;
    const cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool_, stream);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw InputError(fmt::format(
          "out of GPU memory for a micro-batch's saved activations: asked for {:.2f} GiB, "
          "{:.2f} GiB free",
          static_cast<double>(bytes) / (1 << 30), static_cast<double>(free_b) / (1 << 30)));
    }
    FEPLB_CUDA_CHECK(err);
    return p;
  }
  void deallocate(void* ptr, size_t, cudaStream_t stream) override {
    FEPLB_CUDA_WARN(cudaFreeAsync(ptr, stream));
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace

int default_staging_slots(const Knobs& knobs) {
  return static_cast<int>(
      std::max<int64_t>({1, knobs.dyn * knobs.max_helpers_per_expert, knobs.max_num_dyn}));
}

namespace {

// InputError for a configuration no runtime of `world` ranks can run.
void check_config(const RuntimeConfig& cfg, int world) {
  const Topology& topo = cfg.topo;
  FEPLB_REQUIRE_INPUT(world == topo.num_ranks(), "runtime: transport has {} ranks, topology {}",
                      world, topo.num_ranks());
  FEPLB_REQUIRE_INPUT(cfg.shape.dtype == Dtype::kBf16, "runtime: only bf16 experts are supported");
  FEPLB_REQUIRE_INPUT(cfg.shape.hidden > 0 && cfg.shape.hidden % 8 == 0 && cfg.shape.ffn > 0 &&
                          cfg.shape.ffn % 8 == 0,
                      "runtime: hidden {} and ffn {} must be positive multiples of 8",
                      cfg.shape.hidden, cfg.shape.ffn);
  FEPLB_REQUIRE_INPUT(topo.num_experts() <= kernels::kMaxScatterExperts,
                      "runtime: {} experts; the GPU layer takes at most {}", topo.num_experts(),
                      kernels::kMaxScatterExperts);
  FEPLB_REQUIRE_INPUT(cfg.max_top_k >= 1 && cfg.max_top_k <= topo.num_experts(),
                      "runtime: max_top_k {} for {} experts", cfg.max_top_k, topo.num_experts());
  FEPLB_REQUIRE_INPUT(cfg.max_tokens >= 0, "runtime: max_tokens {}", cfg.max_tokens);
  FEPLB_REQUIRE_INPUT(cfg.max_in_flight >= 1, "runtime: max_in_flight {} (at least 1)",
                      cfg.max_in_flight);
  FEPLB_REQUIRE_INPUT(cfg.recv_capacity_rows >= 0 && cfg.guest_capacity_rows >= 0,
                      "runtime: capacities {} and {} rows", cfg.recv_capacity_rows,
                      cfg.guest_capacity_rows);
  FEPLB_REQUIRE_INPUT(cfg.timeout_s > 0, "runtime: timeout {} s", cfg.timeout_s);
  validate_knobs(cfg.knobs);
}

}  // namespace

RuntimeState::RuntimeState(const RuntimeConfig& config, Transport& t) : cfg(config), transport(t) {
  const Topology& topo = cfg.topo;
  rank = transport.rank();
  world = transport.world_size();
  check_config(cfg, world);
  // The expert GEMMs: grouped (sizes read on the GPU) where this GPU runs those kernels; with the
  // call thread, every batch (no cuBLASLt kernel is then loaded lazily on that thread).
  const bool grouped_here = GroupedFfn::available();
  FEPLB_REQUIRE_INPUT(cfg.expert_gemm != ExpertGemm::kGrouped || grouped_here,
                      "runtime: expert_gemm 'grouped' needs a GPU of compute capability 9.0 (H100, "
                      "H200); use 'auto' or 'per_expert' on this one");
  const bool call_thread = wants_call_thread(cfg, world, grouped_here);
  if (call_thread) cfg.expert_gemm = ExpertGemm::kGrouped;
  H = cfg.shape.hidden;
  F = cfg.shape.ffn;
  E = topo.num_experts();
  experts_per_rank = topo.experts_per_rank();
  max_pairs = cfg.max_tokens * cfg.max_top_k;
  recv_cap = cfg.recv_capacity_rows ? cfg.recv_capacity_rows : max_pairs * world;
  guest_cap = cfg.guest_capacity_rows ? cfg.guest_capacity_rows : 2 * max_pairs;
  if (cfg.allocator) {
    allocator = cfg.allocator;
  } else {
    own_allocator = std::make_unique<PoolAllocator>();
    allocator = own_allocator.get();
  }
  const int staging =
      cfg.training ? (cfg.staging_slots >= 0 ? cfg.staging_slots : default_staging_slots(cfg.knobs))
                   : 0;
  FEPLB_REQUIRE_INPUT(!cfg.training || staging >= 1,
                      "runtime: a training runtime needs gradient staging slots");
  pool = std::make_unique<ExpertSlotPool>(
      transport, cfg.shape, static_cast<int>(cfg.knobs.max_num_dyn), staging, cfg.name + ".pool");
  if (cfg.expert_gemm != ExpertGemm::kPerExpert && grouped_here)
    ffn.grouped = std::make_unique<GroupedFfn>(H, F);
  make_arenas();
  const std::string prefix = "feplb." + cfg.name + ".";
  board = std::make_unique<SignalBoard>(transport, prefix + "signals");
  calls.pending.into_here.assign(static_cast<size_t>(world), 0);
  calls.pending.targets.assign(static_cast<size_t>(world), 0);
  if (transport.supports_peer_copies()) {  // the peers' arenas as addressed here
    for (int p = 0; p < world; ++p) {
      arena.peer_guest_in.push_back(
          static_cast<bf16*>(transport.peer_buffer(prefix + "guest_in", p)));
      arena.peer_yrecv.push_back(static_cast<bf16*>(transport.peer_buffer(prefix + "yrecv", p)));
    }
  }
  batches.states.resize(static_cast<size_t>(cfg.max_in_flight));
  if (cfg.measure_planner) measure_planner_times();
  if (call_thread) call_queue = std::make_unique<CallQueue>();
}

// RuntimeConfig::call_thread resolved: kOn where its needs are not met is an InputError.
bool RuntimeState::wants_call_thread(const RuntimeConfig& c, int world, bool grouped_here) {
  if (c.call_thread == CallThread::kOff) return false;
  const bool on = c.call_thread == CallThread::kOn;
  const char* missing = world < 2 ? "several ranks (one rank's calls never wait for their counts)"
                        : !grouped_here || c.expert_gemm == ExpertGemm::kPerExpert
                            ? "the grouped expert GEMMs (a GPU of compute capability 9.0, "
                              "expert_gemm 'auto' or 'grouped')"
                        : !several_hardware_queues()
                            ? "more than one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1: the "
                              "caller's waiting stream would hold up the call thread's work)"
                            : nullptr;
  FEPLB_REQUIRE_INPUT(!on || missing == nullptr, "runtime: call_thread 'on' needs {}", missing);
  return missing == nullptr;
}

void RuntimeState::make_arenas() {
  arena.send = DeviceBuffer<bf16>(static_cast<size_t>(max_pairs * H));
  arena.yrecv = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap * H));
  arena.guest_in = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap * H));
  arena.guest_out = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap * H));
  if (cfg.training) {
    arena.ybuf = DeviceBuffer<bf16>(static_cast<size_t>(max_pairs * H));
    arena.dyrecv = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap * H));
  }
  arena.counts = DeviceBuffer<int32_t>(static_cast<size_t>(E + 2));
  arena.chunk_rows = DeviceBuffer<int32_t>(static_cast<size_t>(kernels::kMaxChunks * E));
  arena.offsets = DeviceBuffer<int32_t>(static_cast<size_t>(E));
  arena.order = DeviceBuffer<int32_t>(static_cast<size_t>(E));
  arena.counts_all = DeviceBuffer<int32_t>(static_cast<size_t>(world * (E + 2)));
  arena.counts_host = PinnedBuffer<int32_t>(static_cast<size_t>(world * (E + 2)));
  // Send order: experts grouped by home rank, each rank's experts in its local order.
  std::vector<int32_t> send_order;
  for (int d = 0; d < world; ++d) {
    for (int e : cfg.topo.local_experts(d)) send_order.push_back(e);
  }
  FEPLB_CUDA_CHECK(cudaMemcpy(arena.order.get(), send_order.data(),
                              send_order.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  // The arenas peers write into, registered with the transport.
  const std::string prefix = "feplb." + cfg.name + ".";
  transport.register_buffer(prefix + "guest_in", arena.guest_in.get(), arena.guest_in.bytes());
  transport.register_buffer(prefix + "yrecv", arena.yrecv.get(), arena.yrecv.bytes());
}

PlannerContext gpu_planner_context(const RuntimeConfig& c, const GemmCostModel* cost) {
  Knobs knobs = c.knobs;
  knobs.prefetch_window_us = prefetch_window_us(c.shape, c.max_tokens, knobs);
  PlannerContext ctx{c.topo, c.shape, knobs, cost};
  if (!cost) {
    ctx.cost_owner = std::make_shared<RooflineCostModel>(c.shape, knobs);
    ctx.cost = ctx.cost_owner.get();
  }
  return ctx;
}

void RuntimeState::measure_planner_times() {
  const std::unique_ptr<Planner> planner = make_planner("feplb", gpu_planner_context(cfg, nullptr));
  planner_times = planner->measure_mode_times(max_pairs);
  const size_t n = planner_times.size();
  if (n == 0) return;
  // Every rank's times (whole us, rounded up), gathered: each mode's largest. Every rank measures
  // the same modes (one configuration), in the same order.
  const size_t count = n * static_cast<size_t>(world);
  PinnedBuffer<int32_t> mine(n), all(count);  // pinned: the copies stay asynchronous (sync bounds
                                              // the wait for a silent peer)
  for (size_t i = 0; i < n; ++i) {
    mine.get()[i] = static_cast<int32_t>(std::min(
        std::ceil(planner_times[i].us), static_cast<double>(std::numeric_limits<int32_t>::max())));
  }
  DeviceBuffer<int32_t> mine_d(n), all_d(count);
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(mine_d.get(), mine.get(), n * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, streams.copy_in.get()));
  transport.all_gather_i32(mine_d.get(), all_d.get(), n, streams.copy_in.get());
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(all.get(), all_d.get(), count * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, streams.copy_in.get()));
  sync(streams.copy_in.get(), "the planner times' all-gather");
  for (size_t r = 0; r < static_cast<size_t>(world); ++r) {
    for (size_t i = 0; i < n; ++i) {
      planner_times[i].us = std::max<double>(planner_times[i].us, all.get()[r * n + i]);
    }
  }
}

size_t CallArenas::device_bytes() const {
  return send.bytes() + ybuf.bytes() + dyrecv.bytes() + yrecv.bytes() + guest_in.bytes() +
         guest_out.bytes() + counts.bytes() + chunk_rows.bytes() + offsets.bytes() + order.bytes() +
         counts_all.bytes();
}

RuntimeState::~RuntimeState() {
  // The scheduler thread is joined first (declared last). Outstanding GPU work may still use the
  // buffers: wait for the copy streams before they are freed.
  FEPLB_CUDA_WARN(cudaStreamSynchronize(streams.copy_in.get()));
  FEPLB_CUDA_WARN(cudaStreamSynchronize(streams.copy_out.get()));
}

namespace {

void check_peers_of(const Transport& transport, const RuntimeConfig& cfg, int rank,
                    const char* waiting_for) {
  const std::string peer = transport.peer_failure();
  if (!peer.empty()) {
    throw Error(fmt::format("runtime '{}' rank {}: {} (while waiting for {})", cfg.name, rank, peer,
                            waiting_for));
  }
}

void sync_of(const Transport& transport, const RuntimeConfig& cfg, int rank, cudaStream_t stream,
             const char* what) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.timeout_s);
  auto next_check = std::chrono::steady_clock::now();
  for (uint64_t spins = 0;; ++spins) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) FEPLB_CUDA_CHECK(err);
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_check) {
      check_peers_of(transport, cfg, rank, what);
      next_check = now + std::chrono::milliseconds(1);
    }
    if (now > deadline) {
      throw Error(
          fmt::format("runtime '{}' rank {}: {}: no progress for {:.0f} s (a peer never answered?)",
                      cfg.name, rank, what, cfg.timeout_s));
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

void RuntimeState::check_peers(const char* waiting_for) const {
  check_peers_of(transport, cfg, rank, waiting_for);
}

void RuntimeState::sync(cudaStream_t stream, const char* what) const {
  sync_of(transport, cfg, rank, stream, what);
}

CallParts::CallParts(RuntimeState& r)
    : cfg(r.cfg),
      rank(r.rank),
      experts_per_rank(r.experts_per_rank),
      H(r.H),
      F(r.F),
      E(r.E),
      transport(r.transport),
      board(*r.board),
      pool(*r.pool),
      arena(r.arena),
      streams(r.streams),
      ffn(r.ffn),
      calls(r.calls) {}

void CallParts::check_peers(const char* waiting_for) const {
  check_peers_of(transport, cfg, rank, waiting_for);
}

void CallParts::sync(cudaStream_t stream, const char* what) const {
  sync_of(transport, cfg, rank, stream, what);
}

void RuntimeState::check_usable(const char* who) const {
  if (calls.failed.load(std::memory_order_acquire)) std::rethrow_exception(calls.error);
  if (call_queue) call_queue->raise();
  if (!calls.open.load(std::memory_order_acquire)) {
    throw InputError(fmt::format("{}: its runtime (rank {}) was destroyed", who, rank));
  }
}

void RuntimeState::drain_calls() const {
  if (call_queue && !call_queue->on_call_thread()) call_queue->drain();
}

int RuntimeState::acquire(int layer_id) {
  std::lock_guard<std::mutex> lock(batches.mu);
  for (size_t i = 0; i < batches.states.size(); ++i) {
    MicroBatchState& h = batches.states[i];
    if (h.in_use) continue;
    h.in_use = true;
    h.generation = batches.next_generation++;
    h.layer_id = layer_id;
    h.dispatched = false;
    h.one_rank = false;
    h.captured = false;
    h.expert_rows = h.expert_row0 = nullptr;
    h.mem_tokens = h.mem_plan = nullptr;
    h.bytes_tokens = h.bytes_plan = 0;
    return static_cast<int>(i);
  }
  throw InputError(fmt::format(
      "forward: {} micro-batches are already in flight (forward done, no backward yet), the "
      "runtime's max_in_flight; run their backwards or drop their handles first",
      batches.states.size()));
}

void RuntimeState::release(int slot, uint64_t generation, cudaStream_t stream) noexcept {
  if (call_queue && !call_queue->on_call_thread()) {  // after the calls queued (the forward's)
    call_queue->post_host([this, slot, generation] { release(slot, generation, nullptr); });
    return;
  }
  std::lock_guard<std::mutex> lock(batches.mu);
  MicroBatchState& h = batches.states[static_cast<size_t>(slot)];
  if (!h.in_use || h.generation != generation) return;
  if (!stream) stream = h.stream;
  try {
    if (h.mem_tokens) allocator->deallocate(h.mem_tokens, h.bytes_tokens, stream);
    if (h.mem_plan) allocator->deallocate(h.mem_plan, h.bytes_plan, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb: releasing a micro-batch's memory: %s\n", e.what());
  }
  h.mem_tokens = h.mem_plan = nullptr;
  h.bytes_tokens = h.bytes_plan = 0;
  h.in_use = false;
  ++h.generation;
}

void* RuntimeState::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  void* p = allocator->allocate(bytes, stream);
  if (!p) {
    throw InputError(fmt::format(
        "the allocator gave no memory for a micro-batch's {:.2f} MiB of saved activations",
        static_cast<double>(bytes) / (1 << 20)));
  }
  return p;
}

size_t RuntimeState::saved_bytes() const {
  std::lock_guard<std::mutex> lock(batches.mu);
  size_t bytes = 0;
  for (const MicroBatchState& h : batches.states) {
    if (h.in_use) bytes += h.bytes_tokens + h.bytes_plan;
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------

EpRuntime::EpRuntime(const RuntimeConfig& config, Transport& transport)
    : state_(std::make_shared<State>(config, transport)) {}

EpRuntime::~EpRuntime() {
  if (!state_) return;
  state_->drain_calls();  // the calls queued run first
  state_->calls.open.store(false, std::memory_order_release);
}

const RuntimeConfig& EpRuntime::config() const { return state_->cfg; }
int EpRuntime::rank() const { return state_->rank; }
int EpRuntime::world_size() const { return state_->world; }
Transport& EpRuntime::transport() const { return state_->transport; }

size_t EpRuntime::workspace_bytes() const {
  const RuntimeState& s = *state_;
  return s.pool->device_bytes() + s.arena.device_bytes() +
         (s.ffn.grouped ? s.ffn.grouped->device_bytes() : 0);
}

size_t EpRuntime::saved_bytes() const {
  state_->drain_calls();
  return state_->saved_bytes();
}

ExpertGemm EpRuntime::expert_gemm() const {
  if (!state_->ffn.grouped) return ExpertGemm::kPerExpert;
  return state_->cfg.expert_gemm == ExpertGemm::kGrouped ? ExpertGemm::kGrouped : ExpertGemm::kAuto;
}

bool EpRuntime::call_thread() const { return state_->call_queue != nullptr; }

int EpRuntime::micro_batches_in_flight() const {
  state_->drain_calls();
  std::lock_guard<std::mutex> lock(state_->batches.mu);
  int n = 0;
  for (const MicroBatchState& h : state_->batches.states) n += h.in_use ? 1 : 0;
  return n;
}

double EpRuntime::scheduler_cpu_seconds() const { return state_->scheduler.cpu_seconds(); }

std::span<const ModeTime> EpRuntime::planner_times() const { return state_->planner_times; }

void EpRuntime::synchronize(cudaStream_t stream) const {
  state_->drain_calls();
  state_->check_usable("synchronize");
  require_uncaptured(stream, "synchronize");
  state_->sync(stream, "synchronize");
}

}  // namespace feplb::cuda
