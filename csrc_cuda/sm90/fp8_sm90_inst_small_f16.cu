// Instantiates the swapped 64-row (small-M) SM90 FP8 configs for f16 output. One TU per group and
// output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kSwap64x16Ping, 1)
QB_SM90_INSTANTIATE(kSwap64x32Ping, 1)
QB_SM90_INSTANTIATE(kSwap64x64Ping, 1)
}  // namespace qb::sm90
