// int8_sm75_f16.cu: the f16-output SM75 INT8 kernels (one TU per output type: parallel build).
#include "int8_sm75_family.cuh"

namespace qb::sm75 {
QB_C2X_DEFINE_MEMBERS(Int8Family)
QB_C2X_INSTANTIATE(Int8Family, 0, cutlass::half_t)
QB_C2X_INSTANTIATE(Int8Family, 1, cutlass::half_t)
}  // namespace qb::sm75
