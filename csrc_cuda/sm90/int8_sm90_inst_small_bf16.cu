// Instantiates the SM90 INT8 configs for up to 64 tokens, bf16 output. Two units per output type,
// so a parallel build spreads the CUTLASS instantiations over cores.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kInt8, kPlainSwap64x16Ping, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kInt8, kPlainSwap64x64Ping, 0)
}  // namespace qb::sm90
