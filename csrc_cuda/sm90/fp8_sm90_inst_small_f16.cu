// Instantiates the swapped 64-row (small-M) SM90 FP8 configs for f16 output. One TU per group and
// output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "fp8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(0, 1)
QB_SM90_INSTANTIATE(1, 1)
QB_SM90_INSTANTIATE(2, 1)
}  // namespace qb::sm90
