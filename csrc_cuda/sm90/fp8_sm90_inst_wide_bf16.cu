// Instantiates the swapped 64-row configs for 64 < M <= 128 (96- and 128-token tiles, 64-token tiles in pairs) for bf16
// output. One TU per group and output type, so a parallel build spreads the CUTLASS instantiations
// over cores.
#include "w8a8_sm90_kernel.cuh"
namespace qb::sm90 {
QB_SM90_INSTANTIATE(kSwap64x96Ping, 0)
QB_SM90_INSTANTIATE(kSwap64x128Ping, 0)
QB_SM90_INSTANTIATE(kSwap64x64PingTokenPair, 0)
}  // namespace qb::sm90
