// int8_sm80_f16.cu: the f16-output SM80 INT8 kernels (one TU per output type: parallel build).
#include "int8_sm80_family.cuh"

namespace qb::sm80 {
QB_C2X_DEFINE_MEMBERS(Int8Family)
QB_C2X_INSTANTIATE(Int8Family, 0, cutlass::half_t)
QB_C2X_INSTANTIATE(Int8Family, 1, cutlass::half_t)
QB_C2X_INSTANTIATE(Int8Family, 2, cutlass::half_t)
}  // namespace qb::sm80
