// One SM90 grouped FP8 config for fp16 output per translation unit, so a parallel
// build spreads the CUTLASS instantiations over cores.
#include "fp8_grouped_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_GROUPED_INSTANTIATE(kGroupedBlock128x128, 1)
}  // namespace qb::sm90
