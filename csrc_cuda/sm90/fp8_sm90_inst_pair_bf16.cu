// Instantiates the 64-token ping-pong SM90 FP8 configs in 2x1 clusters (two token tiles share each
// weight tile through TMA multicast; wave fit for 96 < M <= 128, see wave_fit_config in
// fp8_sm90_dispatch.cu) for bf16 output. One TU per group and output type, so a parallel build spreads
// the CUTLASS instantiations over cores.
#include "fp8_sm90_extended_shapes.h"  // first: it enables CUTLASS wgmma shapes these tiles need
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kPing64x96Cluster2, 0)
QB_SM90_INSTANTIATE(kPing64x160Cluster2, 0)
QB_SM90_INSTANTIATE(kPing64x224Cluster2, 0)
}  // namespace qb::sm90
