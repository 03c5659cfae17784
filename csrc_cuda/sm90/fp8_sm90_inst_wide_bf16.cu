// Instantiates the swapped 64-row configs with 128- and 256-token tiles (64 < M <= 256) for bf16
// output. One TU per group and output type, so a parallel build spreads the CUTLASS instantiations
// over cores.
#include "fp8_sm90_kernel.cuh"
namespace qb::sm90 {
QB_SM90_INSTANTIATE(9, 0)
QB_SM90_INSTANTIATE(10, 0)
}  // namespace qb::sm90
