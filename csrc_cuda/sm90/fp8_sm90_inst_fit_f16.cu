// Instantiates the 128x96 and 128x192 cooperative SM90 FP8 configs (tile widths that fill whole waves
// where 64- and 128-wide tiles leave a ragged one) for f16 output. One TU per group and output
// type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kCoop128x96, 1)
QB_SM90_INSTANTIATE(kCoop128x192, 1)
}  // namespace qb::sm90
