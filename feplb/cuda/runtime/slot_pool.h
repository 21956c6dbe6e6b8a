// ExpertSlotPool: the phase-2 memory one rank's MoE layers share.
//
//   weight slots   [slots, 3HF] bf16   guest experts' weights, written by their owners
//   grad slots     [slots, 3HF] fp32   (training) a guest expert's weight gradient, computed here
//   staging slots  [staging, 3HF] fp32 (training) gradients of this rank's exported expert slices,
//                                      written by the helpers, added into the main gradient here
//
// Every layer of a model uses the same slots, so a slot a layer's forward filled may hold another
// layer's expert by the time this layer runs backward; the pool records which weights each rank's
// slots hold (the same bookkeeping on every rank: all ranks run the same layers in the same order)
// so the backward copies them again only when they were replaced.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/transport.h"

namespace feplb::cuda {

class ExpertSlotPool {
 public:
  // Collective over the transport's ranks (registers the peer-visible buffers). staging_slots 0:
  // forward only (no gradient memory).
  ExpertSlotPool(Transport& transport, const ExpertShape& shape, int slots, int staging_slots,
                 const std::string& name = "pool");
  ExpertSlotPool(const ExpertSlotPool&) = delete;
  ExpertSlotPool& operator=(const ExpertSlotPool&) = delete;

  int slots() const { return slots_; }
  int staging_slots() const { return staging_slots_; }
  bool training() const { return staging_slots_ > 0; }
  const ExpertShape& shape() const { return shape_; }
  size_t device_bytes() const { return weights_.bytes() + grads_.bytes() + staging_.bytes(); }

  __nv_bfloat16* slot(int i) const { return weights_.get() + i * elems_; }
  float* grad_slot(int i) const { return grads_.get() + i * elems_; }
  float* staging_slot(int i) const { return staging_.get() + i * elems_; }
  __nv_bfloat16* peer_slot(int rank, int i) const { return peer_weights_[rank] + i * elems_; }
  float* peer_staging_slot(int rank, int i) const { return peer_staging_[rank] + i * elems_; }

  // What each rank's weight slot holds: a tag from tag(); 0 = nothing known.
  uint64_t& holder(int rank, int i) { return holders_[static_cast<size_t>(rank * slots_ + i)]; }
  static uint64_t tag(int layer_id, int expert, uint32_t forward_seq) {
    return (static_cast<uint64_t>(layer_id + 1) << 48) | (static_cast<uint64_t>(expert) << 32) |
           forward_seq;
  }
  // Ids for the layers using the pool, in construction order (the same on every rank).
  int next_layer_id() { return layers_++; }

  // The grad slots are read by the copy stream of the layer that last sent them to their owners;
  // the next writer waits for this event (recorded by that layer).
  cudaEvent_t grads_free() const { return grads_free_.get(); }
  // This rank's staging slots are free once the last backward's adds out of them are done.
  cudaEvent_t staging_free() const { return staging_free_.get(); }

 private:
  ExpertShape shape_;
  int64_t elems_ = 0;
  int slots_ = 0, staging_slots_ = 0, layers_ = 0;
  DeviceBuffer<__nv_bfloat16> weights_;
  DeviceBuffer<float> grads_, staging_;
  std::vector<__nv_bfloat16*> peer_weights_;
  std::vector<float*> peer_staging_;
  std::vector<uint64_t> holders_;
  Event grads_free_, staging_free_;
};

}  // namespace feplb::cuda
