// fp8_grouped_sm89.cu: the grouped e4m3 GEMM of a mixture of experts' layers (sm_89 SASS +
// compute_89 PTX: Ada natively, Hopper and newer through the PTX).
//
// Group g is rows [offsets[g-1], offsets[g]) of A times expert weight g; its rows of out are
//   block scales:      sum over K blocks of (A . W_g^T)[block] * scale_a[row, kb] * scale_b[g, kb, n/128]
//   row/column scales: (scale_a[row or 0] * scale_b[g, col or 0]) * (A . W_g^T)
// plus bias[g]. Each CTA computes one BM x BN tile of one group with fp8_tile_sm89.cuh.
//
// The row ranges are data on the device: the host launches a grid that covers any split of M rows
// into the G groups (each non-empty group adds at most one partial tile), and each CTA finds its
// group from `offsets` itself: one warp scans the groups' tile counts (warp shuffles over chunks of
// 32 groups) and stops at the group holding the CTA's tile index; CTAs past the last tile exit.
// No host sync and no workspace, so the call is capturable in a CUDA graph with changing routing.
//
// Malformed offsets cannot make a CTA read or write out of bounds: each end is clamped to
// [previous end, M] before use, and rows past the last end (which no valid call has) are written as
// NaN, so a wrong routing shows instead of leaving stale memory in the output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../common/grouped.h"
#include "../common/smem_limit.h"
#include "fp8_tile_sm89.cuh"

namespace qb {
namespace sm89 {
namespace {

constexpr unsigned kFullWarp = 0xffffffffu;

struct GroupedParams {
  const uint8_t* a;        // [M, K], row stride lda bytes
  const uint8_t* w;        // [G][N, K], row stride ldw, group stride w_group bytes
  const int32_t* offsets;  // [G]
  const float* scale_a;
  const float* scale_b;
  const void* bias;        // [G, N] or null
  void* out;               // [M, N], row stride ldo elements
  int64_t lda, ldw, w_group, ldo;
  int64_t sa_stride;       // block: the row stride kb of scale_a [M, kb]; else 1 (per token) or 0 (one value)
  int64_t sb_group;        // block: kb * nb; else N (per column) or 1 (one per group)
  int64_t sb_col;          // row/column scales: 1 (per column) or 0
  int M, N, K, groups, kb, nb, n_tiles;
};

// Where a CTA's tile is: group -1 marks a tile of rows past the last end (written as NaN), -2 no tile.
struct TileSlot {
  int group, start, end, m0;  // the group's rows [start, end) of A; the tile's first row, from start
};

// Finds tile `tile` (in group order, BM rows each, a group's last tile partial) for the whole CTA.
// `ends` is scratch shared memory for G ints.
template <int BM>
__device__ TileSlot find_tile(const GroupedParams& p, int tile, int* ends, TileSlot* slot) {
  for (int g = threadIdx.x; g < p.groups; g += blockDim.x) ends[g] = __ldg(p.offsets + g);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int prev_end = 0, tiles_before = 0;
    TileSlot found{-2, 0, 0, 0};
    for (int c = 0; c < p.groups; c += 32) {
      const int g = c + lane;
      // Clamped ends are the running maximum of min(max(end, 0), M): non-decreasing, within [0, M].
      int end = g < p.groups ? min(max(ends[g], 0), p.M) : 0;
      end = max(end, prev_end);
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(kFullWarp, end, o);
        if (lane >= o) end = max(end, v);
      }
      int start = __shfl_up_sync(kFullWarp, end, 1);
      if (lane == 0) start = prev_end;
      const int tiles = (end - start + BM - 1) / BM;
      int incl = tiles;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(kFullWarp, incl, o);
        if (lane >= o) incl += v;
      }
      incl += tiles_before;
      const int excl = incl - tiles;
      const unsigned hit = __ballot_sync(kFullWarp, tile >= excl && tile < incl);
      if (hit) {
        const int src = __ffs(hit) - 1;
        found.group = c + src;
        found.start = __shfl_sync(kFullWarp, start, src);
        found.end = __shfl_sync(kFullWarp, end, src);
        found.m0 = (tile - __shfl_sync(kFullWarp, excl, src)) * BM;
        break;
      }
      prev_end = __shfl_sync(kFullWarp, end, 31);
      tiles_before = __shfl_sync(kFullWarp, incl, 31);
    }
    if (found.group == -2 && tile - tiles_before < (p.M - prev_end + BM - 1) / BM)
      found = TileSlot{-1, prev_end, p.M, (tile - tiles_before) * BM};
    if (lane == 0) *slot = found;
  }
  __syncthreads();  // the slot is written, and `ends` is free for the tile's stages
  return *slot;
}

template <class T, class OutT>
__device__ void store_nan(const GroupedParams& p, const TileSlot& s, int n0) {
  OutT* out = static_cast<OutT*>(p.out);
  const OutT nan = static_cast<OutT>(NAN);
  const int rows = min(T::kBM, s.end - s.start - s.m0);
  const int cols = min(T::kBN, p.N - n0);
  for (int i = threadIdx.x; i < rows * cols; i += T::kThreads)
    out[int64_t(s.start + s.m0 + i / cols) * p.ldo + n0 + i % cols] = nan;
}

template <class T, class OutT, bool kBlockScaled>
__global__ void __launch_bounds__(T::kThreads, 1) fp8_grouped_sm89_kernel(const GroupedParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ TileSlot slot;
  const int n_tile = static_cast<int>(blockIdx.x % p.n_tiles);
  const int tile = static_cast<int>(blockIdx.x / p.n_tiles);
  const TileSlot s = find_tile<T::kBM>(p, tile, reinterpret_cast<int*>(smem), &slot);
  const int n0 = n_tile * T::kBN;
  if (s.group == -2) return;
  if (s.group == -1) {
    store_nan<T, OutT>(p, s, n0);
    return;
  }
  const int64_t g = s.group;
  TileOperands t{p.a + int64_t(s.start) * p.lda, p.w + g * p.w_group, p.lda, p.ldw, s.end - s.start, p.N, p.K,
                 s.m0, n0, nullptr, p.sa_stride, nullptr, p.nb};
  EpilogueScales es{};
  if constexpr (kBlockScaled) {
    t.scale_a = p.scale_a + int64_t(s.start) * p.sa_stride;
    t.scale_b = p.scale_b + g * p.sb_group;
  } else {
    es = EpilogueScales{p.scale_a + int64_t(s.start) * p.sa_stride, p.sa_stride, p.scale_b + g * p.sb_group,
                        p.sb_col};
  }
  Fragment<T> acc;
  tile_mainloop<T, kBlockScaled>(t, smem, acc);
  const OutT* bias = p.bias ? static_cast<const OutT*>(p.bias) + g * p.N : nullptr;
  store_tile<T, OutT>(acc, t, es, bias, static_cast<OutT*>(p.out) + int64_t(s.start) * p.ldo, p.ldo);
}

constexpr int kNumConfigs = 2;
constexpr const char* kNames[kNumConfigs] = {"sm89_grouped_32x64x128_s4", "sm89_grouped_128x128x128_s3"};

template <class T, class OutT, bool kBlockScaled>
int launch(const GroupedArgs& a, const Err& err, const char* name) {
  static int allowed[kSmemLimitDevices] = {0};
  cudaError_t e = allow_dynamic_smem(fp8_grouped_sm89_kernel<T, OutT, kBlockScaled>, T::kSmemBytes, allowed);
  if (e != cudaSuccess)
    return err.set(QB_ERR_CUDA, "sm89 fp8 grouped config %s: %d bytes of shared memory not granted: %s: %s", name,
                   T::kSmemBytes, cudaGetErrorName(e), cudaGetErrorString(e));
  GroupedParams p{};
  p.a = static_cast<const uint8_t*>(a.a);
  p.w = static_cast<const uint8_t*>(a.b);
  p.offsets = a.offsets;
  p.scale_a = a.scale_a;
  p.scale_b = a.scale_b;
  p.bias = a.bias;
  p.out = a.out;
  p.lda = a.lda;
  p.ldw = a.ldb;
  p.w_group = a.ldb_group;
  p.ldo = a.ldo;
  p.M = static_cast<int>(a.M);
  p.N = static_cast<int>(a.N);
  p.K = static_cast<int>(a.K);
  p.groups = static_cast<int>(a.groups);
  p.kb = static_cast<int>(cdiv(a.K, kBlockK));
  p.nb = static_cast<int>(cdiv(a.N, kBlockK));
  p.n_tiles = static_cast<int>(cdiv(a.N, T::kBN));
  if (kBlockScaled) {
    p.sa_stride = p.kb;
    p.sb_group = int64_t(p.kb) * p.nb;
  } else {
    p.sa_stride = a.scale_a_per_row ? 1 : 0;
    p.sb_group = a.scale_b_per_col ? a.N : 1;
    p.sb_col = a.scale_b_per_col ? 1 : 0;
  }
  // Tiles of any split of M rows into G groups (and the rows past the last end): at most M / BM
  // whole tiles plus one partial tile per non-empty range, of which there are at most min(G + 1, M).
  const int64_t tiles = a.M / T::kBM + std::min<int64_t>(a.groups + 1, a.M);
  const int64_t ctas = tiles * p.n_tiles;
  if (ctas > 0x7FFFFFFF)
    return err.set(QB_ERR_UNSUPPORTED, "sm89 fp8 grouped: M=%lld N=%lld G=%lld needs %lld CTAs (over 2^31)",
                   (long long)a.M, (long long)a.N, (long long)a.groups, (long long)ctas);
  fp8_grouped_sm89_kernel<T, OutT, kBlockScaled><<<static_cast<unsigned>(ctas), T::kThreads, T::kSmemBytes, a.stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return err.set(QB_ERR_CUDA, "sm89 fp8 grouped config %s launch (%lld CTAs): %s: %s", name, (long long)ctas,
                   cudaGetErrorName(e), cudaGetErrorString(e));
  return QB_OK;
}

template <class T>
int launch_for(const GroupedArgs& a, const Err& err, const char* name) {
  if (a.block_scaled)
    return a.out_dtype == QB_F16 ? launch<T, __half, true>(a, err, name) : launch<T, __nv_bfloat16, true>(a, err, name);
  return a.out_dtype == QB_F16 ? launch<T, __half, false>(a, err, name) : launch<T, __nv_bfloat16, false>(a, err, name);
}

}  // namespace
}  // namespace sm89

int sm89_fp8_grouped_scaled_mm(const GroupedArgs& a, const Err& err) {
  using namespace sm89;
  static_assert(SmallTile::kSmemBytes >= 1024 * 4, "the offsets scan borrows the stages' shared memory");
  if (a.config >= kNumConfigs)
    return err.set(QB_ERR_UNSUPPORTED, "sm89 fp8 grouped: no config %d (there are %d)", a.config, kNumConfigs);
  // Few rows per group (decode: a token's rows spread over its top-k experts) stream the weights
  // through narrow tiles; prefill runs 128 x 128.
  const int64_t ranges = std::min<int64_t>(a.groups, a.M);
  const int config = a.config >= 0 ? a.config : (a.M <= 32 * ranges ? 0 : 1);
  return config == 0 ? launch_for<SmallTile>(a, err, kNames[0]) : launch_for<LargeTile>(a, err, kNames[1]);
}

int sm89_fp8_grouped_config_count() { return sm89::kNumConfigs; }
const char* sm89_fp8_grouped_config_name(int c) {
  return c >= 0 && c < sm89::kNumConfigs ? sm89::kNames[c] : nullptr;
}

}  // namespace qb
