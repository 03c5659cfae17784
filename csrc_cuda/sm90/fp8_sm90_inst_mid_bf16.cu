// Instantiates the swapped 128-row and the 128x128 cooperative SM90 FP8 configs for bf16 output. One TU per group and
// output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kSwap128x64Coop, 0)
QB_SM90_INSTANTIATE(kCoop128x128, 0)
}  // namespace qb::sm90
