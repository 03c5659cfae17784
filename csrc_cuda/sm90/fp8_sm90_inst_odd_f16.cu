// Instantiates the SM90 FP8 configs whose tiles are 160 and 224 channels wide (wave fit, see
// wave_fit_config in fp8_sm90_dispatch.cu) for f16 output. One TU per group and output type, so a
// parallel build spreads the CUTLASS instantiations over cores.
#include "fp8_sm90_extended_shapes.h"  // first: it enables CUTLASS wgmma shapes these tiles need
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(kPing128x160Cluster2, 1)
QB_SM90_INSTANTIATE(kCoop128x224, 1)
}  // namespace qb::sm90
