// marlin_sm80.cu: the SM80 family of the W8A16 kernel (cp.async pipeline, ldmatrix, mma.m16n8k16,
// fp16 and bf16 activations). Compiled for sm_80 SASS + compute_80 PTX.
#include "marlin_host.cuh"

namespace qbmarlin {

int sm80_marlin_mm(const MmArgs& args, char* err, size_t err_len) { return host::run_mm<80>(args, err, err_len); }

int sm80_marlin_prepare(const void* w, int64_t ldw, int N, int K, bool bf16, void* packed, int32_t* nan_count,
                        cudaStream_t stream, char* err, size_t err_len) {
  return host::run_prepare<80>(w, ldw, N, K, bf16, packed, nan_count, stream, err, err_len);
}

}  // namespace qbmarlin

#if defined(QB_MARLIN_TRACE)
// Development builds only (see the trace notes in marlin_kernel.cuh): copies the recorded timeline
// of the SM80 family's last launches into dst (kTraceBlocks x kTraceSlots values), clears it, and
// returns kTraceSlots (or -1 on a CUDA error).
extern "C" __attribute__((visibility("default"))) int qb_marlin_trace_read(unsigned long long* dst, int max_values) {
  using namespace qbmarlin::kern;
  const int n = kTraceBlocks * kTraceSlots;
  if (max_values < n) return -1;
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  if (cudaMemcpyFromSymbol(dst, g_trace, n * sizeof(unsigned long long)) != cudaSuccess) return -1;
  static unsigned long long zeros[kTraceBlocks * kTraceSlots];
  if (cudaMemcpyToSymbol(g_trace, zeros, sizeof(zeros)) != cudaSuccess) return -1;
  return kTraceSlots;
}
#endif
