// Instantiates the unswapped 64x80 ping-pong SM90 FP8 config (wave fit for 32 < M <= 64, see
// wave_fit_config in fp8_sm90_dispatch.cu; an extended wgmma shape) for f16 output. One TU per group
// and output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "fp8_sm90_extended_shapes.h"  // first: it enables CUTLASS wgmma shapes these tiles need
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kPing64x80, 1)
}  // namespace qb::sm90
