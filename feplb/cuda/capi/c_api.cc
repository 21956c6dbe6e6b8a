#include "feplb/cuda/c_api.h"

#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "feplb/core/error.h"
#include "feplb/core/metrics.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/runtime.h"
#include "feplb/cuda/transport.h"

using json = nlohmann::json;
using namespace feplb;
using namespace feplb::cuda;

struct feplb_group {
  std::unique_ptr<InProcessGroup> group;
};

struct feplb_runtime {
  std::unique_ptr<feplb::cuda::Transport>
      own_transport;  // NCCL: a transport over the borrowed communicator
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<EpRuntime> runtime;
};

struct feplb_layer {
  Topology topo = Topology::contiguous(1, 1, 1);
  std::unique_ptr<MoeLayer> layer;
  std::vector<ExpertParams> params;
  std::vector<ExpertGrads> grads;
};

namespace {

thread_local std::string g_error;

// Runs f, turning exceptions into the C API's codes and this thread's message.
template <typename F>
int guarded(F&& f) {
  try {
    f();
    g_error.clear();
    return FEPLB_OK;
  } catch (const InputError& e) {
    g_error = e.what();
    return FEPLB_INPUT_ERROR;
  } catch (const std::exception& e) {
    g_error = e.what();
    return FEPLB_ERROR;
  } catch (...) {
    g_error = "unknown exception";
    return FEPLB_ERROR;
  }
}

void require_ptr(const void* p, const char* what) {
  FEPLB_REQUIRE_INPUT(p != nullptr, "{} is null", what);
}

// The caller's allocator behind the runtime's interface.
class CallbackAllocator final : public Allocator {
 public:
  explicit CallbackAllocator(const feplb_allocator& a) : a_(a) {
    FEPLB_REQUIRE_INPUT(a_.allocate && a_.deallocate,
                        "allocator: allocate and deallocate must both be set");
  }
  void* allocate(size_t bytes, cudaStream_t stream) override {
    return a_.allocate(bytes, stream, a_.ctx);
  }
  void deallocate(void* ptr, size_t bytes, cudaStream_t stream) override {
    a_.deallocate(ptr, bytes, stream, a_.ctx);
  }

 private:
  feplb_allocator a_;
};

// The topology of a runtime config: contiguous homes, or the config's `homes`.
Topology parse_topology(const json& j, int64_t ranks, int64_t experts, int64_t gpn) {
  FEPLB_REQUIRE_INPUT(ranks >= 1 && ranks <= 4096 && experts >= 1 && experts <= (1 << 20) &&
                          gpn >= 1 && gpn <= 4096,
                      "runtime config: {} ranks, {} experts, {} GPUs per node", ranks, experts,
                      gpn);
  if (j.contains("homes")) {
    FEPLB_REQUIRE_INPUT(j["homes"].is_array(), "runtime config: 'homes' must be an array of ranks");
    std::vector<int> homes;
    for (const auto& h : j["homes"]) {
      FEPLB_REQUIRE_INPUT(h.is_number_integer(), "runtime config: 'homes' holds a non-integer");
      homes.push_back(h.get<int>());
    }
    return Topology::with_placement(static_cast<int>(ranks), static_cast<int>(gpn),
                                    std::move(homes));
  }
  return Topology::contiguous(static_cast<int>(ranks), static_cast<int>(gpn),
                              static_cast<int>(experts));
}

// A runtime config's `knobs` object, through set_knob (the CLI's and the Python module's parser).
void parse_knobs(const json& knobs, Knobs& out) {
  FEPLB_REQUIRE_INPUT(knobs.is_object(), "runtime config: 'knobs' must be an object");
  // set_knob: the knob parser of the CLI and the Python module too (same messages).
  for (const auto& [name, value] : knobs.items()) {
    require_knob_name(name);
    FEPLB_REQUIRE_INPUT(value.is_number(), "knob {}: expected a number, got {}", name,
                        value.type_name());
    const std::string digits = value.dump();  // an integer above int64's range
    if (value.is_number_float()) {
      set_knob(out, name, value.get<double>());
    } else if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX}) {
      set_knob(out, name, std::string_view(digits));
    } else {
      set_knob(out, name, value.get<int64_t>());
    }
  }
}

RuntimeConfig parse_config(const char* text) {
  require_ptr(text, "config_json");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("runtime config: not JSON: {}", e.what()));
  }
  FEPLB_REQUIRE_INPUT(j.is_object(), "runtime config: a JSON object is expected");
  static const char* const kKeys[] = {"ranks",
                                      "gpus_per_node",
                                      "experts",
                                      "homes",
                                      "hidden",
                                      "ffn",
                                      "max_top_k",
                                      "max_tokens",
                                      "knobs",
                                      "recv_capacity_rows",
                                      "guest_capacity_rows",
                                      "staging_slots",
                                      "max_in_flight",
                                      "training",
                                      "timing",
                                      "timeout_s",
                                      "name",
                                      "expert_gemm",
                                      "call_thread"};
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    FEPLB_REQUIRE_INPUT(known, "runtime config: unknown key '{}'", key);
  }
  const auto get_int = [&](const char* key, int64_t def) -> int64_t {
    if (!j.contains(key)) return def;
    FEPLB_REQUIRE_INPUT(j[key].is_number_integer(), "runtime config: '{}' must be an integer", key);
    return j[key].get<int64_t>();
  };
  const auto get_bool = [&](const char* key, bool def) -> bool {
    if (!j.contains(key)) return def;
    FEPLB_REQUIRE_INPUT(j[key].is_boolean(), "runtime config: '{}' must be true or false", key);
    return j[key].get<bool>();
  };
  RuntimeConfig c;
  const int64_t ranks = get_int("ranks", 1), experts = get_int("experts", 0);
  const int64_t gpn = get_int("gpus_per_node", 8);
  c.topo = parse_topology(j, ranks, experts, gpn);
  c.shape = ExpertShape{get_int("hidden", 0), get_int("ffn", 0), Dtype::kBf16};
  c.max_top_k = static_cast<int>(get_int("max_top_k", c.max_top_k));
  c.max_tokens = get_int("max_tokens", 0);
  if (j.contains("knobs")) parse_knobs(j["knobs"], c.knobs);
  c.recv_capacity_rows = get_int("recv_capacity_rows", 0);
  c.guest_capacity_rows = get_int("guest_capacity_rows", 0);
  c.staging_slots = static_cast<int>(get_int("staging_slots", -1));
  c.max_in_flight = static_cast<int>(get_int("max_in_flight", c.max_in_flight));
  c.training = get_bool("training", true);
  c.timing = get_bool("timing", false);
  if (j.contains("timeout_s")) {
    FEPLB_REQUIRE_INPUT(j["timeout_s"].is_number() && j["timeout_s"].get<double>() > 0,
                        "runtime config: 'timeout_s' must be a positive number");
    c.timeout_s = j["timeout_s"].get<double>();
  }
  if (j.contains("name")) {
    FEPLB_REQUIRE_INPUT(j["name"].is_string(), "runtime config: 'name' must be a string");
    c.name = j["name"].get<std::string>();
  }
  if (j.contains("expert_gemm")) {
    const json& v = j["expert_gemm"];
    const std::string g = v.is_string() ? v.get<std::string>() : "";
    FEPLB_REQUIRE_INPUT(g == "auto" || g == "grouped" || g == "per_expert",
                        "runtime config: 'expert_gemm' must be \"auto\", \"grouped\" or "
                        "\"per_expert\", not {}",
                        v.dump());
    c.expert_gemm = g == "grouped"      ? ExpertGemm::kGrouped
                    : g == "per_expert" ? ExpertGemm::kPerExpert
                                        : ExpertGemm::kAuto;
  }
  if (j.contains("call_thread")) {
    const json& v = j["call_thread"];
    const std::string t = v.is_string() ? v.get<std::string>() : "";
    FEPLB_REQUIRE_INPUT(t == "off" || t == "on" || t == "auto",
                        "runtime config: 'call_thread' must be \"off\", \"on\" or \"auto\", not {}",
                        v.dump());
    c.call_thread = t == "on"     ? CallThread::kOn
                    : t == "auto" ? CallThread::kAuto
                                  : CallThread::kOff;
  }
  return c;
}

void write_json(const json& j, char* buf, size_t cap, size_t* len) {
  const std::string s = j.dump();
  if (len) *len = s.size() + 1;
  if (buf && cap > 0) {
    const size_t n = std::min(cap - 1, s.size());
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
}

// Micro-batches handed out through the C ABI, by number.
struct Handles {
  std::mutex mu;
  std::unordered_map<int64_t, MicroBatch> live;
  int64_t next = 1;
  int64_t put(MicroBatch&& mb) {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t id = next++;
    live.emplace(id, std::move(mb));
    return id;
  }
  MicroBatch take(int64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = live.find(id);
    FEPLB_REQUIRE_INPUT(it != live.end(),
                        "micro-batch handle {} is unknown (consumed by a backward, or dropped)",
                        id);
    MicroBatch mb = std::move(it->second);
    live.erase(it);
    return mb;
  }
};

Handles& handles() {
  static Handles h;
  return h;
}

// The layer's own view of the caller's per-expert pointers (no allocation once sized).
void fill_params(feplb_layer* l, const void* const* gate_up, const void* const* down, int n) {
  FEPLB_REQUIRE_INPUT(n >= 0 && (n == 0 || (gate_up && down)),
                      "weights: {} experts with null pointer arrays", n);
  l->params.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    l->params[i] = {static_cast<const bf16*>(gate_up[i]), static_cast<const bf16*>(down[i])};
  }
}

// The layer's own view of the caller's per-expert gradient pointers, of `dtype` (FEPLB_GRAD_*).
void fill_grads(feplb_layer* l, void* const* gate_up, void* const* down, int n, int dtype) {
  FEPLB_REQUIRE_INPUT(n == 0 || (gate_up && down), "gradients: null pointer arrays");
  FEPLB_REQUIRE_INPUT(dtype == FEPLB_GRAD_F32 || dtype == FEPLB_GRAD_BF16,
                      "grad_dtype {} (FEPLB_GRAD_F32 = 0 or FEPLB_GRAD_BF16 = 1)", dtype);
  l->grads.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ExpertGrads& g = l->grads[static_cast<size_t>(i)];
    g = {};
    if (dtype == FEPLB_GRAD_BF16) {
      g.gate_up_bf16 = static_cast<bf16*>(gate_up[i]);
      g.down_bf16 = static_cast<bf16*>(down[i]);
    } else {
      g.gate_up = static_cast<float*>(gate_up[i]);
      g.down = static_cast<float*>(down[i]);
    }
  }
}

GradMode grad_mode(int accumulate) {
  return accumulate ? GradMode::kAccumulate : GradMode::kOverwrite;
}

// A forward's micro-batch kept for its backward, by number (0: none kept).
int64_t keep(MicroBatch&& mb) { return mb.valid() ? handles().put(std::move(mb)) : 0; }

// n calls on n threads (n > 1), the first failure rethrown; n == 1 on this thread.
template <typename F>
void on_ranks(int n, F&& f) {
  FEPLB_REQUIRE_INPUT(n >= 1, "{} ranks", n);
  if (n == 1) {
    f(0);
    return;
  }
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// A batched call: f(args[r]) for each of the n ranks (on_ranks), once its layer is checked and
// holds the rank's weights.
template <typename Args, typename F>
int per_rank(int n, Args* args, F&& f) {
  return guarded([&] {
    require_ptr(args, "args");
    on_ranks(n, [&](int r) {
      Args& a = args[r];
      require_ptr(a.layer, "layer");
      fill_params(a.layer, a.gate_up, a.down, a.num_experts);
      f(a);
    });
  });
}

// Where a call's time on the caller's thread went (feplb/cuda/stats.h).
json host_json(const feplb::cuda::HostTimes& t) {
  return {{"call_us", t.call_us},     {"await_us", t.await_us},       {"gemm_us", t.gemm_us},
          {"kernel_us", t.kernel_us}, {"exchange_us", t.exchange_us}, {"sync_us", t.sync_us},
          {"hooks_us", t.hooks_us},   {"build_us", t.build_us},       {"refine_us", t.refine_us},
          {"gemms", t.gemms}};
}

}  // namespace

extern "C" {

const char* feplb_last_error(void) { return g_error.c_str(); }

int feplb_group_create(int world, double timeout_s, feplb_group** out) {
  return guarded([&] {
    require_ptr(out, "out");
    auto g = std::make_unique<feplb_group>();
    g->group = std::make_unique<InProcessGroup>(world, timeout_s);
    *out = g.release();
  });
}

void feplb_group_destroy(feplb_group* group) { delete group; }

int feplb_nccl_unique_id(char out[128]) {
  return guarded([&] {
    require_ptr(out, "out");
    static_assert(sizeof(ncclUniqueId) == 128, "NCCL unique ids are 128 bytes");
    ncclUniqueId id{};
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw Error(fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
    std::memcpy(out, id.internal, sizeof(id.internal));
  });
}

int feplb_nccl_comm_init(const char id_bytes[128], int world, int rank, int device,
                         double timeout_s, void** comm_out) {
  return guarded([&] {
    require_ptr(id_bytes, "id");
    require_ptr(comm_out, "comm_out");
    FEPLB_REQUIRE_INPUT(world >= 1 && rank >= 0 && rank < world, "NCCL init: rank {} of {}", rank,
                        world);
    FEPLB_REQUIRE_INPUT(timeout_s > 0, "NCCL init: timeout {} s", timeout_s);
    *comm_out =
        NcclCommunicator::from_unique_id(id_bytes, rank, world, device, timeout_s).release();
  });
}

int feplb_nccl_comm_destroy(void* comm) {
  return guarded([&] {
    require_ptr(comm, "comm");
    const ncclResult_t r = ncclCommDestroy(static_cast<ncclComm_t>(comm));
    if (r != ncclSuccess) throw Error(fmt::format("ncclCommDestroy: {}", ncclGetErrorString(r)));
  });
}

int feplb_runtime_create_inproc(const char* config_json, feplb_group* group, int rank,
                                const feplb_allocator* allocator, feplb_runtime** out) {
  return guarded([&] {
    require_ptr(group, "group");
    require_ptr(out, "out");
    RuntimeConfig c = parse_config(config_json);
    FEPLB_REQUIRE_INPUT(rank >= 0 && rank < group->group->world_size(), "rank {} of a group of {}",
                        rank, group->group->world_size());
    auto rt = std::make_unique<feplb_runtime>();
    if (allocator) {
      rt->allocator = std::make_unique<CallbackAllocator>(*allocator);
      c.allocator = rt->allocator.get();
    }
    rt->runtime = std::make_unique<EpRuntime>(c, group->group->endpoint(rank));
    *out = rt.release();
  });
}

int feplb_runtime_create_nccl(const char* config_json, void* nccl_comm, int device,
                              const feplb_allocator* allocator, feplb_runtime** out) {
  return guarded([&] {
    require_ptr(nccl_comm, "nccl_comm");
    require_ptr(out, "out");
    RuntimeConfig c = parse_config(config_json);
    FEPLB_CUDA_CHECK(cudaSetDevice(device));
    auto rt = std::make_unique<feplb_runtime>();
    if (allocator) {
      rt->allocator = std::make_unique<CallbackAllocator>(*allocator);
      c.allocator = rt->allocator.get();
    }
    rt->own_transport = make_nccl_transport(nccl_comm, device);  // collective (peer probe)
    rt->runtime = std::make_unique<EpRuntime>(c, *rt->own_transport);
    *out = rt.release();
  });
}

void feplb_runtime_destroy(feplb_runtime* runtime) { delete runtime; }

int feplb_runtime_info_json(feplb_runtime* runtime, char* buf, size_t cap, size_t* len) {
  return guarded([&] {
    require_ptr(runtime, "runtime");
    const EpRuntime& r = *runtime->runtime;
    write_json({{"rank", r.rank()},
                {"world_size", r.world_size()},
                {"experts_per_rank", r.config().topo.experts_per_rank()},
                {"workspace_bytes", r.workspace_bytes()},
                {"saved_bytes", r.saved_bytes()},
                {"micro_batches_in_flight", r.micro_batches_in_flight()},
                {"scheduler_cpu_seconds", r.scheduler_cpu_seconds()},
                {"expert_gemm", r.expert_gemm() == ExpertGemm::kGrouped ? "grouped"
                                : r.expert_gemm() == ExpertGemm::kAuto  ? "auto"
                                                                        : "per_expert"},
                {"call_thread", r.call_thread()}},
               buf, cap, len);
  });
}

int feplb_layer_create(feplb_runtime* runtime, int top_k, const char* name, const char* policy,
                       feplb_layer** out) {
  return guarded([&] {
    require_ptr(runtime, "runtime");
    require_ptr(policy, "policy");
    require_ptr(out, "out");
    auto l = std::make_unique<feplb_layer>();
    l->topo = runtime->runtime->config().topo;
    l->layer =
        std::make_unique<MoeLayer>(*runtime->runtime, LayerConfig{top_k, name ? name : "moe"},
                                   make_gpu_planner(*runtime->runtime, policy));
    *out = l.release();
  });
}

void feplb_layer_destroy(feplb_layer* layer) { delete layer; }

int feplb_forward(int n, feplb_forward_args* args) {
  return per_rank(n, args, [](feplb_forward_args& a) {
    a.handle = keep(a.layer->layer->forward(
        a.layer->params, static_cast<const bf16*>(a.hidden), a.topk_idx, a.topk_weight,
        a.num_tokens, static_cast<bf16*>(a.out), static_cast<cudaStream_t>(a.stream)));
  });
}

int feplb_backward(int n, const feplb_backward_args* args) {
  return per_rank(n, args, [](const feplb_backward_args& a) {
    fill_grads(a.layer, a.grad_gate_up, a.grad_down, a.num_experts, a.grad_dtype);
    MicroBatch mb = handles().take(a.handle);
    a.layer->layer->backward(std::move(mb), a.layer->params, static_cast<const bf16*>(a.grad_out),
                             a.topk_weight, static_cast<bf16*>(a.grad_hidden), a.grad_topk_weight,
                             a.layer->grads, grad_mode(a.accumulate),
                             static_cast<cudaStream_t>(a.stream));
  });
}

int feplb_forward_dispatched(int n, feplb_dispatched_forward_args* args) {
  return per_rank(n, args, [](feplb_dispatched_forward_args& a) {
    FEPLB_REQUIRE_INPUT(a.num_experts == 0 || a.rows_per_expert, "rows_per_expert is null");
    a.handle = keep(a.layer->layer->forward_dispatched(
        a.layer->params, static_cast<const bf16*>(a.rows),
        std::span<const int64_t>(a.rows_per_expert, static_cast<size_t>(a.num_experts)),
        static_cast<bf16*>(a.out_rows), static_cast<cudaStream_t>(a.stream)));
  });
}

int feplb_backward_dispatched(int n, const feplb_dispatched_backward_args* args) {
  return per_rank(n, args, [](const feplb_dispatched_backward_args& a) {
    fill_grads(a.layer, a.grad_gate_up, a.grad_down, a.num_experts, a.grad_dtype);
    MicroBatch mb = handles().take(a.handle);
    a.layer->layer->backward_dispatched(
        std::move(mb), a.layer->params, static_cast<const bf16*>(a.grad_out_rows),
        static_cast<bf16*>(a.grad_rows), a.layer->grads, grad_mode(a.accumulate),
        static_cast<cudaStream_t>(a.stream));
  });
}

int feplb_handle_drop(int64_t handle) {
  return guarded([&] { MicroBatch mb = handles().take(handle); });
}

int feplb_layer_sync_gradients(feplb_layer* layer, void* stream) {
  return guarded([&] {
    require_ptr(layer, "layer");
    layer->layer->sync_gradients(static_cast<cudaStream_t>(stream));
  });
}

int feplb_layer_stats_json(feplb_layer* layer, char* buf, size_t cap, size_t* len) {
  return guarded([&] {
    require_ptr(layer, "layer");
    const MoeLayer& l = *layer->layer;
    const Plan& plan = l.last_plan();
    const RoutingStep& routing = l.last_routing();
    const Topology& topo = layer->topo;
    // Rows per GPU with every expert at home (before balancing) and as the plan computes them.
    std::vector<int64_t> before(static_cast<size_t>(topo.num_ranks()), 0), after(before.size(), 0);
    if (routing.num_experts == topo.num_experts()) {
      for (int e = 0; e < topo.num_experts(); ++e)
        before[static_cast<size_t>(topo.home(e))] += routing.expert_counts[e];
    }
    for (const Slice& s : plan.slices) after[static_cast<size_t>(s.gpu)] += s.rows;
    int64_t moved_slices = 0, moved_rows = 0;
    const ForwardStats& f = l.last_forward_stats();
    const BackwardStats& b = l.last_backward_stats();
    // Slices computed away from their expert's home: two-phase copies their rows there, one-hop
    // sends them there in the dispatch (no copy of rows at all), so the slices count, not copies.
    for (const Slice& s : plan.slices) {
      if (s.rows > 0 && s.gpu != topo.home(s.expert)) {
        ++moved_slices;
        moved_rows += s.rows;
      }
    }
    json j;
    j["policy"] = std::string(l.policy());
    j["rows_per_gpu_before"] = before;
    j["rows_per_gpu_after"] = after;
    j["experts_moved"] = moved_slices;
    j["rows_moved"] = moved_rows;
    j["weight_bytes"] = plan.weight_bytes();
    j["token_bytes"] = plan.token_bytes();
    j["forward"] = {{"counts_to_host_us", f.counts_to_host_us},
                    {"plan_us", f.plan_us},
                    {"plan_reserve_us", f.plan_reserve_us},
                    {"counts_to_plan_us", f.counts_to_plan_us},
                    {"plan_to_first_copy_us", f.plan_to_first_copy_us},
                    {"counts_to_first_copy_us", f.counts_to_first_copy_us},
                    {"copies", f.copies},
                    {"guest_rows", f.guest_rows},
                    {"exported_rows", f.exported_rows},
                    {"forward_ms", f.forward_ms},
                    {"copy_wait_ms", f.wait_ms},
                    {"host", host_json(f.host)}};
    j["backward"] = {{"copies", b.copies},         {"weight_recopies", b.weight_recopies},
                     {"guest_rows", b.guest_rows}, {"backward_ms", b.backward_ms},
                     {"copy_wait_ms", b.wait_ms},  {"host", host_json(b.host)}};
    write_json(j, buf, cap, len);
  });
}

}  // extern "C"
