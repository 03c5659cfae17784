// One SM90 block-scaled FP8 config for bf16 output per translation unit, so a parallel build spreads
// the CUTLASS instantiations over cores.
#include "fp8_block_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_BLOCK_INSTANTIATE(kBlockOverlapSwap128x64, 0)
}  // namespace qb::sm90
