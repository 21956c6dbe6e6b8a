#include "feplb/cuda/runtime/signal_board.h"

namespace feplb::cuda {

SignalBoard::SignalBoard(Transport& transport, const std::string& name)
    : rank_(transport.rank()),
      layout_(transport.world_size()),
      signals_(transport.make_signals(name, layout_.slots())) {}

void SignalBoard::signal(SignalFamily family, int to, uint32_t value, cudaStream_t stream) {
  signals_->signal(to, layout_.slot(family, rank_), value, stream);
}

void SignalBoard::wait(SignalFamily family, int from, uint32_t value, cudaStream_t stream) {
  signals_->wait(layout_.slot(family, from), value, stream);
}

}  // namespace feplb::cuda
