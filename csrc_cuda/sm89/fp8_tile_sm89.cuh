// fp8_tile_sm89.cuh: one CTA's e4m3 x e4m3 output tile with mma.sync (sm_89+), shared by the
// block-scaled GEMM (fp8_block_sm89.cu) and the grouped GEMM of mixtures of experts
// (fp8_grouped_sm89.cu), which differ only in where a CTA's tile and operands are.
//
// A CTA computes a BM x BN tile of out = A . W^T, A e4m3 [rows, K], W e4m3 [N, K], stepping K one
// 128-deep block at a time. A and W tiles go global -> shared through a multistage cp.async ring
// (rows beyond `rows` or N and 16-byte chunks beyond K are zero-filled, so partial tiles and a
// partial last K block need no other care), shared -> registers through ldmatrix, and into
// mma.sync m16n8k32 e4m3 with fp32 accumulation.
//   Block scaling: the products of one K block accumulate in a partial fragment, which is then
//   scaled by that block's scales (scale_a [rows, kb], scale_b [kb, nb]) and added to the output
//   fragment in fp32 (two-level accumulation, as the sm_90a kernels do).
//   Row/column scaling: the whole K range accumulates in the output fragment; the epilogue applies
//   scale_a[row] * scale_b[col] once.
//
// Shared memory rows are 128 bytes (one K block of one row); a row's eight 16-byte chunks are stored
// XOR-swizzled by (row % 8), so that the eight row addresses of an ldmatrix hit distinct banks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace qb {
namespace sm89 {

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

// Few rows: narrow tiles so that the weight is streamed by many CTAs; else 128 x 128.
using SmallTile = BlockTile<32, 64, 2, 2, 4>;
using LargeTile = BlockTile<128, 128, 2, 4, 3>;

// One tile's operands. Row indices are relative to `a` (the first row of the tile's row range).
struct TileOperands {
  const uint8_t* a;       // [rows, K], row stride lda bytes
  const uint8_t* w;       // [N, K], row stride ldw bytes
  int64_t lda, ldw;
  int rows, N, K;         // rows of `a` that exist; the weight's N and K
  int m0, n0;             // the tile's first row (of `a`) and column
  const float* scale_a;   // block scaling: [rows, kb] row-major from `a`'s first row (stride sa_ld); else unused
  int64_t sa_ld;
  const float* scale_b;   // block scaling: [kb, nb] row-major; else unused
  int nb;
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
__device__ __forceinline__ void load_stage(const TileOperands& t, uint8_t* smem, int stage, int kt) {
  uint8_t* base = smem + stage * T::kStageBytes;
  const int k0 = kt * kBlockK;
  constexpr int kChunks = (T::kBM + T::kBN) * (kBlockK / 16);
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += T::kThreads) {
    const int row = i >> 3, chunk = i & 7;
    const bool is_a = row < T::kBM;
    const int grow = is_a ? t.m0 + row : t.n0 + row - T::kBM;
    const int k = k0 + chunk * 16;
    const bool valid = grow < (is_a ? t.rows : t.N) && k < t.K;  // K % 16 == 0: a chunk is all in or all out
    const uint8_t* src = is_a ? t.a + (valid ? grow * t.lda + k : 0) : t.w + (valid ? grow * t.ldw + k : 0);
    cp_async_16_or_zero(smem_addr(base) + swizzled(row, chunk), src, valid);
  }
}

// The accumulator fragment of one thread: acc[m16 tile][n8 tile][4]; c0, c1 at (row lane/4,
// columns 2 * (lane % 4) + 0, 1) of each m16n8 tile, c2, c3 eight rows below.
template <class T>
using Fragment = float[T::kMTiles][T::kNTiles][4];

// The tile's products into `acc` (zeroed here). kBlockScaled: each K block's partial products are
// scaled by its scales before they are added; else the sums are unscaled (the epilogue scales).
template <class T, bool kBlockScaled>
__device__ __forceinline__ void tile_mainloop(const TileOperands& t, uint8_t* smem, Fragment<T>& acc) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm0 = (warp / T::kWarpsN) * T::kMTiles * 16, wn0 = (warp % T::kWarpsN) * T::kNTiles * 8;
  const int ktiles = (t.K + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  // Block scaling: the scales of this thread's accumulator rows (row lane/4 and lane/4 + 8 of each
  // m16 tile); rows past `rows` get scale 0.
  const float* sa_rows[T::kMTiles][2];
  const float* sb_col = nullptr;
  if constexpr (kBlockScaled) {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = t.m0 + wm0 + mt * 16 + (lane >> 2) + h * 8;
        sa_rows[mt][h] = r < t.rows ? t.scale_a + int64_t(r) * t.sa_ld : nullptr;
      }
    sb_col = t.scale_b + t.n0 / kBlockK;
  }

#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < ktiles) load_stage<T>(t, smem, s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is no longer read
    const int next = kt + T::kStages - 1;
    if (next < ktiles) load_stage<T>(t, smem, next % T::kStages, next);
    cp_async_commit();

    // Scales first: their global loads overlap the MMAs below.
    float sb = 0.f, sa[T::kMTiles][2];
    if constexpr (kBlockScaled) {
      sb = __ldg(sb_col + int64_t(kt) * t.nb);
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) sa[mt][h] = sa_rows[mt][h] ? __ldg(sa_rows[mt][h] + kt) : 0.f;
    }

    const uint32_t a_base = smem_addr(smem + (kt % T::kStages) * T::kStageBytes);
    const uint32_t w_base = a_base + T::kBM * kBlockK;
    Fragment<T> part;
    if constexpr (kBlockScaled) {
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) part[mt][nt][i] = 0.f;
    }
    Fragment<T>& sums = kBlockScaled ? part : acc;
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
        for (int nt = 0; nt < T::kNTiles; ++nt) mma_e4m3(sums[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
    if constexpr (kBlockScaled) {
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
  }
  cp_async_wait<0>();  // no cp.async may be left writing shared memory when the CTA exits
}

// The epilogue's scaling: out = acc * (scale_a[row] * scale_b[col]) + bias[col]. A null scale_a
// and scale_b (block scaling: acc is scaled already) skip the product; a stride of 0 makes a
// scale one value for every row or column.
struct EpilogueScales {
  const float* scale_a;  // indexed by the row relative to the tile's `a`
  int64_t sa_stride;
  const float* scale_b;  // indexed by the column
  int64_t sb_stride;
};

// Stores the tile's rows below `rows` (relative to `out`, row stride ldo) and columns below N.
template <class T, class OutT>
__device__ __forceinline__ void store_tile(const Fragment<T>& acc, const TileOperands& t, const EpilogueScales& s,
                                           const OutT* bias, OutT* out, int64_t ldo) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm0 = (warp / T::kWarpsN) * T::kMTiles * 16, wn0 = (warp % T::kWarpsN) * T::kNTiles * 8;
#pragma unroll
  for (int nt = 0; nt < T::kNTiles; ++nt) {
    const int col = t.n0 + wn0 + nt * 8 + (lane & 3) * 2;
    if (col >= t.N) continue;  // N % 8 == 0: a column pair is all in or all out
    float b0 = 0.f, b1 = 0.f;
    if (bias) {
      b0 = static_cast<float>(bias[col]);
      b1 = static_cast<float>(bias[col + 1]);
    }
    float c0 = 1.f, c1 = 1.f;
    if (s.scale_b) {
      c0 = __ldg(s.scale_b + col * s.sb_stride);
      c1 = __ldg(s.scale_b + (col + 1) * s.sb_stride);
    }
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = t.m0 + wm0 + mt * 16 + (lane >> 2) + h * 8;
        if (row >= t.rows) continue;
        float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
        if (s.scale_a) {  // (scale_a * scale_b) first, as the reference multiplies
          const float r = __ldg(s.scale_a + row * s.sa_stride);
          v0 *= r * c0;
          v1 *= r * c1;
        }
        *reinterpret_cast<uint32_t*>(out + int64_t(row) * ldo + col) = pack2<OutT>(v0 + b0, v1 + b1);
      }
  }
}

}  // namespace sm89
}  // namespace qb
