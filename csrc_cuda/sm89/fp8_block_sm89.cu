// fp8_block_sm89.cu: block-scaled FP8 GEMM for Ada (sm_89 SASS + compute_89 PTX, so newer GPUs,
// the H200 included, can run it JIT-compiled).
//
// out[M, N] = sum over K blocks kb of (A[:, kb] . W[:, kb]^T) * scale_a[:, kb] * scale_b[kb, n / 128]
//             (+ bias), A e4m3 [M, K] (1 x 128 groups), W e4m3 [N, K] (128 x 128 blocks).
//
// CUTLASS 2.x has no blockwise-scaling mainloop for mma.sync, so the kernel is written here: one CTA
// per output tile, the tile computed by fp8_tile_sm89.cuh with per-K-block promotion.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/qb_common.h"
#include "../common/smem_limit.h"
#include "fp8_tile_sm89.cuh"

namespace qb {
namespace sm89 {
namespace {

struct Params {
  const uint8_t* a;  // [M, K], row stride lda bytes
  const uint8_t* w;  // [N, K], row stride ldw bytes
  const float* scale_a;  // [M, kb] row-major
  const float* scale_b;  // [kb, nb] row-major
  const void* bias;      // [N] of the output type, or null
  void* out;             // [M, N], row stride ldo elements
  int64_t lda, ldw, ldo;
  int M, N, K, kb, nb;
};

template <class T, class OutT>
__global__ void __launch_bounds__(T::kThreads, 1) fp8_block_sm89_kernel(const Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  TileOperands t{p.a, p.w, p.lda, p.ldw, p.M, p.N, p.K, static_cast<int>(blockIdx.x) * T::kBM,
                 static_cast<int>(blockIdx.y) * T::kBN, p.scale_a, p.kb, p.scale_b, p.nb};
  Fragment<T> acc;
  tile_mainloop<T, true>(t, smem, acc);
  store_tile<T, OutT>(acc, t, EpilogueScales{}, static_cast<const OutT*>(p.bias), static_cast<OutT*>(p.out), p.ldo);
}

// Few tokens: narrow tiles so that the weight is streamed by many CTAs; else 128 x 128.
constexpr int kNumConfigs = 2;
constexpr const char* kNames[kNumConfigs] = {"sm89_block_32x64x128_s4", "sm89_block_128x128x128_s3"};

template <class T, class OutT>
int launch(const ScaledMmArgs& a, const Err& err, const char* name) {
  static int allowed[kSmemLimitDevices] = {0};
  cudaError_t e = allow_dynamic_smem(fp8_block_sm89_kernel<T, OutT>, T::kSmemBytes, allowed);
  if (e != cudaSuccess)
    return err.set(QB_ERR_CUDA, "sm89 fp8 block config %s: %d bytes of shared memory not granted: %s: %s", name,
                   T::kSmemBytes, cudaGetErrorName(e), cudaGetErrorString(e));
  Params p{};
  p.a = static_cast<const uint8_t*>(a.a);
  p.w = static_cast<const uint8_t*>(a.b);
  p.scale_a = a.scale_a;
  p.scale_b = a.scale_b;
  p.bias = a.bias;
  p.out = a.out;
  p.lda = a.lda;
  p.ldw = a.ldb;
  p.ldo = a.ldo;
  p.M = static_cast<int>(a.M);
  p.N = static_cast<int>(a.N);
  p.K = static_cast<int>(a.K);
  p.kb = static_cast<int>(cdiv(a.K, kBlockK));
  p.nb = static_cast<int>(cdiv(a.N, kBlockK));
  const dim3 grid(static_cast<unsigned>(cdiv(a.M, T::kBM)), static_cast<unsigned>(cdiv(a.N, T::kBN)));
  fp8_block_sm89_kernel<T, OutT><<<grid, T::kThreads, T::kSmemBytes, a.stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return err.set(QB_ERR_CUDA, "sm89 fp8 block config %s launch (grid %u x %u): %s: %s", name, grid.x, grid.y,
                   cudaGetErrorName(e), cudaGetErrorString(e));
  return QB_OK;
}

template <class T>
int launch_for_out(const ScaledMmArgs& a, const Err& err, const char* name) {
  return a.out_dtype == QB_F16 ? launch<T, __half>(a, err, name) : launch<T, __nv_bfloat16>(a, err, name);
}

}  // namespace
}  // namespace sm89

int sm89_fp8_block_scaled_mm(const ScaledMmArgs& a, const Err& err) {
  using namespace sm89;
  if (a.config >= kNumConfigs)
    return err.set(QB_ERR_UNSUPPORTED, "sm89 fp8 block: no config %d (there are %d)", a.config, kNumConfigs);
  // 16-byte cp.async rows and 4-byte output pairs; the public checks already give these.
  if (a.lda % 16 || a.ldb % 16 || reinterpret_cast<uintptr_t>(a.a) % 16 || reinterpret_cast<uintptr_t>(a.b) % 16 ||
      a.ldo % 2 || reinterpret_cast<uintptr_t>(a.out) % 4)
    return err.set(QB_ERR_UNSUPPORTED,
                   "sm89 fp8 block: a and b need 16-byte aligned rows (lda %lld, ldb %lld) and out 4-byte aligned "
                   "column pairs (ldo %lld)",
                   (long long)a.lda, (long long)a.ldb, (long long)a.ldo);
  if (a.M > 0x7FFFFFFF || a.N > 0x7FFFFFFF || a.K > 0x7FFFFFFF || cdiv(a.N, 64) > 65535)
    return err.set(QB_ERR_UNSUPPORTED, "sm89 fp8 block: M=%lld N=%lld K=%lld too large", (long long)a.M,
                   (long long)a.N, (long long)a.K);
  const int config = a.config >= 0 ? a.config : (a.M <= 32 ? 0 : 1);
  return config == 0 ? launch_for_out<SmallTile>(a, err, kNames[0]) : launch_for_out<LargeTile>(a, err, kNames[1]);
}

size_t sm89_fp8_block_workspace(const ScaledMmArgs&) { return 0; }
int sm89_fp8_block_config_count() { return sm89::kNumConfigs; }
const char* sm89_fp8_block_config_name(int c) {
  return c >= 0 && c < sm89::kNumConfigs ? sm89::kNames[c] : nullptr;
}

}  // namespace qb
