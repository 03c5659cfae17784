// Instantiates the swapped 128-row and the 128x128 cooperative SM90 FP8 configs for f16 output. One TU per group and
// output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kSwap128x64Coop, 1)
QB_SM90_INSTANTIATE(kCoop128x128, 1)
}  // namespace qb::sm90
