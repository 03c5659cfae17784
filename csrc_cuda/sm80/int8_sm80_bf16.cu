// int8_sm80_bf16.cu: the bf16-output SM80 INT8 kernels (one TU per output type: parallel build).
#include "int8_sm80_family.cuh"

namespace qb::sm80 {
QB_C2X_DEFINE_MEMBERS(Int8Family)
QB_C2X_INSTANTIATE(Int8Family, 0, cutlass::bfloat16_t)
QB_C2X_INSTANTIATE(Int8Family, 1, cutlass::bfloat16_t)
QB_C2X_INSTANTIATE(Int8Family, 2, cutlass::bfloat16_t)
}  // namespace qb::sm80
