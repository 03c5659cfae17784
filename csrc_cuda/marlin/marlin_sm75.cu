// marlin_sm75.cu: the SM75 family of the W8A16 kernel (register-staged global loads, ldmatrix,
// mma.m16n8k8, fp16 activations only). Compiled for sm_75 SASS + compute_75 PTX.
#include "marlin_host.cuh"

namespace qbmarlin {

int sm75_marlin_mm(const MmArgs& args, char* err, size_t err_len) { return host::run_mm<75>(args, err, err_len); }

int sm75_marlin_prepare(const void* w, int64_t ldw, int N, int K, bool bf16, void* packed, int32_t* nan_count,
                        cudaStream_t stream, char* err, size_t err_len) {
  return host::run_prepare<75>(w, ldw, N, K, bf16, packed, nan_count, stream, err, err_len);
}

}  // namespace qbmarlin
