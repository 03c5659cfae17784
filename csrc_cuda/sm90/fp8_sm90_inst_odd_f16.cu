// Instantiates the SM90 FP8 configs whose tiles are 160 and 224 channels wide (wave fit, see
// wave_fit_config in fp8_sm90_dispatch.cu) for f16 output. They need the extended wgmma shapes
// (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, set for the whole sm90 family in CMakeLists.txt). One TU
// per group and output type, so a parallel build spreads the CUTLASS instantiations over cores.
#include "fp8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_INSTANTIATE(13, 1)
QB_SM90_INSTANTIATE(14, 1)
}  // namespace qb::sm90
