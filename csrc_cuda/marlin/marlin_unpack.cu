// marlin_unpack.cu: the SM80 family's unpack kernel (a packed weight back to a dense [N, K] matrix in
// the activation dtype, scales applied), in a translation unit of its own: marlin_sm80.cu, and so
// the machine code of the mm kernels, stays as it is. Compiled for sm_80 SASS + compute_80 PTX.
#include "marlin_host.cuh"

namespace qbmarlin {

int sm80_marlin_unpack(const void* packed, int N, int K, bool bf16, const float* scale, bool scale_per_col, void* out,
                       int64_t ldo, cudaStream_t stream, char* err, size_t err_len) {
  return host::run_unpack<80>(packed, N, K, bf16, scale, scale_per_col, out, ldo, stream, err, err_len);
}

}  // namespace qbmarlin
