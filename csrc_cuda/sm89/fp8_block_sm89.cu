// fp8_block_sm89.cu: block-scaled FP8 GEMM for Ada (sm_89 SASS + compute_89 PTX, so newer GPUs,
// the H200 included, can run it JIT-compiled).
//
// out[M, N] = sum over K blocks kb of (A[:, kb] . W[:, kb]^T) * scale_a[:, kb] * scale_b[kb, n / 128]
//             (+ bias), A e4m3 [M, K] (1 x 128 groups), W e4m3 [N, K] (128 x 128 blocks).
//
// CUTLASS 2.x has no blockwise-scaling mainloop for mma.sync, so the kernel is written here. Each CTA
// computes a BM x BN tile; its K loop steps one 128-deep scale block at a time. A and W tiles go
// global -> shared through a multistage cp.async ring (rows beyond M or N and 16-byte chunks beyond
// K are zero-filled, so partial tiles and a partial last K block need no other care), shared ->
// registers through ldmatrix, and into mma.sync m16n8k32 e4m3 with fp32 accumulation. The products
// of one K block accumulate in a partial fragment, which is then scaled by that block's scales and
// added to the output fragment in fp32 (two-level accumulation, as the sm_90a kernels do).
//
// Shared memory rows are 128 bytes (one K block of one row); a row's eight 16-byte chunks are stored
// XOR-swizzled by (row % 8), so that the eight row addresses of an ldmatrix hit distinct banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/qb_common.h"
#include "../common/smem_limit.h"

namespace qb {
namespace sm89 {
namespace {

constexpr int kBlockK = 128;  // K elements (bytes) per step: one scale block

// BM x BN CTA tile over WARPS_M x WARPS_N warps, STAGES-deep cp.async ring. BN divides 128, so the
// tile's columns share one weight scale block per K step.
template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
struct BlockTile {
  static constexpr int kBM = BM, kBN = BN, kStages = STAGES;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpsN = WARPS_N;
  static constexpr int kMTiles = BM / WARPS_M / 16;  // m16 tiles per warp
  static constexpr int kNTiles = BN / WARPS_N / 8;   // n8 tiles per warp
  static constexpr int kStageBytes = (BM + BN) * kBlockK;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static_assert(128 % BN == 0, "a tile's columns must lie in one 128-column scale block");
  static_assert(kNTiles % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
  static_assert(kMTiles >= 1 && (BM / WARPS_M) % 16 == 0, "warp rows must be whole m16 tiles");
};

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

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of 16-byte chunk `chunk` (0..7) of shared row `row`.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kBlockK + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async_16_or_zero(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: no global read, the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <class OutT>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}

// One K block of A (BM rows) and W (BN rows) into ring stage `stage`.
template <class T>
__device__ __forceinline__ void load_stage(const Params& p, uint8_t* smem, int stage, int kt, int m0, int n0) {
  uint8_t* base = smem + stage * T::kStageBytes;
  const int k0 = kt * kBlockK;
  constexpr int kChunks = (T::kBM + T::kBN) * (kBlockK / 16);
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += T::kThreads) {
    const int row = i >> 3, chunk = i & 7;
    const bool is_a = row < T::kBM;
    const int grow = is_a ? m0 + row : n0 + row - T::kBM;
    const int k = k0 + chunk * 16;
    const bool valid = grow < (is_a ? p.M : p.N) && k < p.K;  // K % 16 == 0: a chunk is all in or all out
    const uint8_t* src = is_a ? p.a + (valid ? grow * p.lda + k : 0) : p.w + (valid ? grow * p.ldw + k : 0);
    cp_async_16_or_zero(smem_addr(base) + swizzled(row, chunk), src, valid);
  }
}

template <class T, class OutT>
__global__ void __launch_bounds__(T::kThreads, 1) fp8_block_sm89_kernel(const Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp / T::kWarpsN, warp_n = warp % T::kWarpsN;
  const int m0 = blockIdx.x * T::kBM, n0 = blockIdx.y * T::kBN;
  const int wm0 = warp_m * T::kMTiles * 16, wn0 = warp_n * T::kNTiles * 8;
  const int ktiles = (p.K + kBlockK - 1) / kBlockK;

  float acc[T::kMTiles][T::kNTiles][4] = {};
  // The scales of this thread's accumulator rows (row lane/4 and lane/4 + 8 of each m16 tile).
  const float* sa_rows[T::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + wm0 + mt * 16 + (lane >> 2) + h * 8;
      sa_rows[mt][h] = r < p.M ? p.scale_a + int64_t(r) * p.kb : nullptr;  // rows past M: scale 0
    }
  const float* sb_col = p.scale_b + n0 / kBlockK;

#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < ktiles) load_stage<T>(p, smem, s, s, m0, n0);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is no longer read
    const int next = kt + T::kStages - 1;
    if (next < ktiles) load_stage<T>(p, smem, next % T::kStages, next, m0, n0);
    cp_async_commit();

    // Scales first: their global loads overlap the MMAs below.
    const float sb = __ldg(sb_col + int64_t(kt) * p.nb);
    float sa[T::kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sa[mt][h] = sa_rows[mt][h] ? __ldg(sa_rows[mt][h] + kt) : 0.f;

    const uint32_t a_base = smem_addr(smem + (kt % T::kStages) * T::kStageBytes);
    const uint32_t w_base = a_base + T::kBM * kBlockK;
    float part[T::kMTiles][T::kNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBlockK / 32; ++kk) {
      uint32_t af[T::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)  // matrices: rows 0-7 / 8-15 x k bytes 0-15 / 16-31
        ldmatrix_x4(af[mt], a_base + swizzled(wm0 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
      uint32_t bf[T::kNTiles][2];
#pragma unroll
      for (int np = 0; np < T::kNTiles / 2; ++np) {  // matrices: n 0-7 / 8-15 x k bytes 0-15 / 16-31
        uint32_t r[4];
        ldmatrix_x4(r, w_base + swizzled(wn0 + np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt) mma_e4m3(part[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      const float s0 = sa[mt][0] * sb, s1 = sa[mt][1] * sb;
#pragma unroll
      for (int nt = 0; nt < T::kNTiles; ++nt) {
        acc[mt][nt][0] = fmaf(part[mt][nt][0], s0, acc[mt][nt][0]);
        acc[mt][nt][1] = fmaf(part[mt][nt][1], s0, acc[mt][nt][1]);
        acc[mt][nt][2] = fmaf(part[mt][nt][2], s1, acc[mt][nt][2]);
        acc[mt][nt][3] = fmaf(part[mt][nt][3], s1, acc[mt][nt][3]);
      }
    }
  }
  cp_async_wait<0>();  // no cp.async may be left writing shared memory when the CTA exits

  // Epilogue: c0, c1 at (row lane/4, columns 2 * (lane % 4) + 0, 1); c2, c3 eight rows below.
  const OutT* bias = static_cast<const OutT*>(p.bias);
  OutT* out = static_cast<OutT*>(p.out);
#pragma unroll
  for (int nt = 0; nt < T::kNTiles; ++nt) {
    const int col = n0 + wn0 + nt * 8 + (lane & 3) * 2;
    if (col >= p.N) continue;  // N % 8 == 0: a column pair is all in or all out
    float b0 = 0.f, b1 = 0.f;
    if (bias) {
      b0 = static_cast<float>(bias[col]);
      b1 = static_cast<float>(bias[col + 1]);
    }
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm0 + mt * 16 + (lane >> 2) + h * 8;
        if (row < p.M)
          *reinterpret_cast<uint32_t*>(out + int64_t(row) * p.ldo + col) =
              pack2<OutT>(acc[mt][nt][2 * h] + b0, acc[mt][nt][2 * h + 1] + b1);
      }
  }
}

// Few tokens: narrow tiles so that the weight is streamed by many CTAs; else 128 x 128.
using SmallTile = BlockTile<32, 64, 2, 2, 4>;
using LargeTile = BlockTile<128, 128, 2, 4, 3>;
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
