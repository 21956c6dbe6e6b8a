#include "feplb/cuda/runtime/slot_pool.h"

#include "feplb/cuda/gemm/expert_ffn.h"

namespace feplb::cuda {

ExpertSlotPool::ExpertSlotPool(Transport& transport, const ExpertShape& shape, int slots,
                               int staging_slots, const std::string& name)
    : shape_(shape),
      elems_(expert_weight_elems(shape.hidden, shape.ffn)),
      slots_(slots),
      staging_slots_(staging_slots) {
  FEPLB_REQUIRE_INPUT(slots >= 0 && staging_slots >= 0, "slot pool: {} slots, {} staging slots",
                      slots, staging_slots);
  const int R = transport.world_size();
  weights_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(slots_ * elems_));
  if (training()) {
    grads_ = DeviceBuffer<float>(static_cast<size_t>(slots_ * elems_));
    staging_ = DeviceBuffer<float>(static_cast<size_t>(staging_slots_ * elems_));
  }
  holders_.assign(static_cast<size_t>(R * slots_), 0);
  const std::string prefix = "feplb." + name + ".";
  transport.register_buffer(prefix + "slots", weights_.get(), weights_.bytes());
  if (training()) transport.register_buffer(prefix + "staging", staging_.get(), staging_.bytes());
  peer_weights_.assign(static_cast<size_t>(R), nullptr);
  peer_staging_.assign(static_cast<size_t>(R), nullptr);
  if (transport.supports_peer_copies()) {
    for (int p = 0; p < R; ++p) {
      peer_weights_[p] = static_cast<__nv_bfloat16*>(transport.peer_buffer(prefix + "slots", p));
      if (training())
        peer_staging_[p] = static_cast<float*>(transport.peer_buffer(prefix + "staging", p));
    }
  }
}

}  // namespace feplb::cuda
