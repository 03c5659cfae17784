// One SM90 W8A16 config for f16 activations per translation unit, so a parallel build spreads the
// CUTLASS instantiations over cores.
#include "w8a16_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_W8A16_INSTANTIATE(kMix128x32Coop, 1)
}  // namespace qb::sm90
