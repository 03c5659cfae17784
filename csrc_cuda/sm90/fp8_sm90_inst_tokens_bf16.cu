// Instantiates the swapped 64-row config whose one 192-token tile covers 128 < M <= 192 (each weight
// tile is read by one CTA, once; see wave_fit_config in fp8_sm90_dispatch.cu) for bf16 output. One
// TU per group and output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "w8a8_sm90_kernel.cuh"
namespace qb::sm90 {
QB_SM90_INSTANTIATE(kSwap64x192Ping, 0)
}  // namespace qb::sm90
