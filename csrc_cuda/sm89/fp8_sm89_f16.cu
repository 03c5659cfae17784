// fp8_sm89_f16.cu: the f16-output SM89 FP8 kernels (one TU per output type: parallel build).
#include "fp8_sm89_family.cuh"

namespace qb::sm89 {
QB_C2X_DEFINE_MEMBERS(Fp8Family)
QB_C2X_INSTANTIATE(Fp8Family, 0, cutlass::half_t)
QB_C2X_INSTANTIATE(Fp8Family, 1, cutlass::half_t)
QB_C2X_INSTANTIATE(Fp8Family, 2, cutlass::half_t)
}  // namespace qb::sm89
