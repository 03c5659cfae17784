// fp8_sm90_small_m.cu: the SM90 FP8 GEMM for few tokens, written for the one thing that decides its
// speed: streaming the weight from HBM at full rate, one GEMM straight after the other.
//
// It computes out^T[N, M] = W[N, K] . A[M, K]^T. Each CTA owns `rows` weight rows (64 or 128: the
// wgmma M side), a tile of `tokens` tokens (8 to 64: the wgmma N side) and a contiguous range of K.
// What sets it apart from the CUTLASS kernels the dispatcher uses otherwise:
// - A deep ring in at most half an SM's shared memory. Launched as a programmatic dependent, the
//   next GEMM's CTAs find room next to this one's and are ready the moment it finishes; that
//   hand-over, not the arithmetic, is what separates small-M GEMMs from HBM speed.
// - Weight prefetch into L2 before waiting for the previous kernel: the first tiles are on their
//   way while that kernel finishes. A prefetch into L2 reads nothing into the SM; every actual read
//   (weights included) happens after griddepcontrol.wait, so data the previous kernel writes is
//   always seen complete.
// - Split-K inside a thread block cluster. When N / rows leaves most SMs idle, the `splits` CTAs of
//   a cluster each stream one part of K and add up their fp32 partial sums through distributed
//   shared memory: no workspace, no counters, no second kernel, and a fixed summation order, so
//   results do not vary from run to run.
// - Several tiles per CTA. When there are more row tiles than SMs, a CTA streams `whole` tiles of
//   its own through the same ring before its part of the cluster's last, shared tile: the next
//   tile's loads start while the last one's are still being multiplied, where a second wave of CTAs
//   would start from an empty ring. A cluster of C CTAs covers C * whole + 1 tiles; the automatic
//   plans use C = 1 here (the shared tile is then simply the CTA's last), since clusters that split
//   the last tile to even out the SMs' shares measured slower.
//
// Warps 0-3 form the consumer warpgroup (wgmma m64nTk32 with the weight tile as the A operand and
// the token tile as B, both K-major in 128-byte-swizzled shared memory written by TMA); one thread
// of warp 4 issues the TMA loads.
//
// The same kernel runs W8A16 (bf16/fp16 activations, e4m3 weights; kMixed): a stage then holds the
// token tile's 128 K values as two 64-value halves of 128-byte rows, and the wgmmas are m64nTk16 in
// the activation dtype with A from registers: each thread reads its fragment of the e4m3 weight
// tile from shared memory and converts it exactly (every e4m3 value is a bf16 and an fp16 value).
// The fragments of two consecutive stages live in separate registers, so that one stage's wgmmas
// run while the next stage's weights are converted.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include <cooperative_groups.h>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "../common/smem_limit.h"
#include "fp8_sm90_small_m.h"

namespace qb::sm90 {
namespace {

constexpr int kTileK = 128;             // K bytes per stage: one 128-byte swizzle row
constexpr int kThreads = 160;           // consumer warpgroup + producer warp
constexpr int kMaxStages = 12;
constexpr int kMaxSplits = 8;           // the portable cluster size limit
constexpr int kSmemPerSm = 228 * 1024;  // H100 / H200, the sm_90a parts
constexpr int kSmemOptin = 227 * 1024 - 256;  // the per-block limit, less this kernel's static barriers
// Dynamic shared memory per CTA (ring, alignment slack and output staging) the ring depth is sized
// for: half an SM, less the 1 KiB the system reserves per CTA and this kernel's static barriers, so
// that when the next kernel is launched as a programmatic dependent, its CTAs find room next to
// this kernel's and start while this one finishes (on the H200, deeper rings that left room for
// only one CTA per SM were slower at the small shapes in trial sweeps).
constexpr int kCtaSmemTarget = (kSmemPerSm - 2 * 1024) / 2 - 256;
// Outputs of a 64-row block are staged token-major, the output's own layout, rows padded by 8
// elements: the four token columns a warp writes at once then start 32 bytes apart in the banks
// (conflict free), and every row piece stays 16-byte aligned. Elements per staged row:
constexpr int kStagedPitch = 64 + 8;
// Weight tiles each CTA asks L2 for before the previous kernel has finished: enough to keep HBM
// busy across the hand-over. In trial sweeps on the H200, asking for a CTA's whole range was slower
// (the flood of requests cost more than it hid), and two tiles were slightly faster than none on
// most shapes.
constexpr int kPrefetchTiles = 2;

struct Params {
  CUtensorMap w_map;  // [N, K] weight, boxes of rows x 128
  CUtensorMap a_map;  // [M, K] tokens, boxes of tokens x 128
  void* out;
  int64_t ldo;
  const float* scale_a;
  const float* scale_b;
  const void* bias;
  int M, N;
  int k_tiles;
  int row_tiles;
  int whole;  // tiles each CTA streams alone before the cluster's shared tile
  int stages;
  int scale_a_per_row, scale_b_per_col;
};

using cutlass::arch::ClusterBarrier;
using cutlass::arch::ClusterTransactionBarrier;

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle TMA writes: rows of 128
// bytes, 8-row groups 1024 bytes apart (stride offset); the leading offset is unused in this mode.
// Stepping K by 32 bytes inside the swizzle row is a plain address offset because the tiles are
// 1024-byte aligned (the swizzle is a function of the address bits).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// wgmma m64 nT k32, e4m3 x e4m3 -> f32, both operands K-major from shared memory (CuTe's selector
// gives MMA_64xTx32_F32E4M3E4M3_SS_TN for T = 8, 16, 32, 64).
template <int T>
using GmmaOp = decltype(cute::SM90::GMMA::ss_op_selector<cute::float_e4m3_t, cute::float_e4m3_t, float,
                                                         cute::Shape<cute::_64, cute::Int<T>, cute::_32>>());

template <int T, size_t... I>
__device__ __forceinline__ void gmma(uint64_t w, uint64_t a, float (&d)[T / 2], std::index_sequence<I...>) {
  GmmaOp<T>::fma(w, a, d[I]...);
}

// wgmma m64 nT k16 in the activation dtype, A (the converted weight) from registers, B K-major from
// shared memory.
template <class ActT>
using CuteAct = std::conditional_t<std::is_same_v<ActT, __half>, cute::half_t, cute::bfloat16_t>;
template <int T, class ActT>
using GmmaRsOp = decltype(cute::SM90::GMMA::rs_op_selector<CuteAct<ActT>, CuteAct<ActT>, float,
                                                           cute::Shape<cute::_64, cute::Int<T>, cute::_16>>());

template <int T, class ActT, size_t... I>
__device__ __forceinline__ void gmma_rs(const uint32_t (&w)[4], uint64_t a, float (&d)[T / 2],
                                        std::index_sequence<I...>) {
  GmmaRsOp<T, ActT>::fma(w[0], w[1], w[2], w[3], a, d[I]...);
}

// Two e4m3 values (low byte first) as the activation dtype's pair, exactly.
template <class ActT>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t two) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  if constexpr (std::is_same_v<ActT, __half>) {
    return h;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// This thread's wgmma A fragment of the 16 K values kk * 16 .. kk * 16 + 15 of one 64-row block of the
// weight tile (row pitch 128 bytes, 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8)):
// rows r0 and r0 + 8, K pairs 2q, 2q + 1 and 2q + 8, 2q + 9 (q = lane % 4), as the activation dtype.
template <class ActT>
__device__ __forceinline__ void load_fragment(const uint8_t* block, int r0, int lane, int kk, uint32_t (&f)[4]) {
  const int chunk = (kk ^ (r0 & 7)) * 16, q = lane % 4;
  const int word = 4 * (q >> 1), shift = 16 * (q & 1);
  const uint8_t* lo = block + r0 * kTileK + chunk;
  const uint8_t* hi = lo + 8 * kTileK;
  f[0] = e4m3x2_to<ActT>(*reinterpret_cast<const uint32_t*>(lo + word) >> shift);
  f[1] = e4m3x2_to<ActT>(*reinterpret_cast<const uint32_t*>(hi + word) >> shift);
  f[2] = e4m3x2_to<ActT>(*reinterpret_cast<const uint32_t*>(lo + 8 + word) >> shift);
  f[3] = e4m3x2_to<ActT>(*reinterpret_cast<const uint32_t*>(hi + 8 + word) >> shift);
}

// The four consumer warps meet (named barrier 1; the producer warp is not part of it).
__device__ __forceinline__ void consumer_barrier() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// kMixed: W8A16 (activations of OutT's dtype); otherwise e4m3 activations.
template <int ROWS, int TOK, class OutT, bool kMixed>
__global__ void __launch_bounds__(kThreads) small_m_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kActBytes = kMixed ? 2 : 1;
  constexpr int kWBytes = ROWS * kTileK;
  constexpr int kXHalf = TOK * kTileK;  // one 128-byte-row sub-tile of tokens
  constexpr int kStageBytes = kWBytes + TOK * kTileK * kActBytes;
  constexpr int kBlocks = ROWS / 64;  // m64 wgmma blocks per tile
  constexpr int kAcc = TOK / 2;       // fp32 accumulators per thread and block
  __shared__ alignas(8) uint64_t full[kMaxStages];
  __shared__ alignas(8) uint64_t empty[kMaxStages];
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* ring = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);  // swizzled tiles need 1024 B alignment

  const int rank = blockIdx.x, splits = gridDim.x;  // the cluster spans gridDim.x
  const int tok_tile = blockIdx.z;
  // This CTA's segments: its own tiles (all of K), then its share of K of the cluster's shared tile.
  // A tile past the end is skipped; the shared tile is the cluster's last, so when it is past the
  // end, every CTA of the cluster agrees and the reduction is skipped too.
  const int first_tile = blockIdx.y * (splits * p.whole + 1);
  const int own_first = first_tile + rank * p.whole, shared_tile = first_tile + splits * p.whole;
  const int own = max(0, min(p.whole, p.row_tiles - own_first));
  const bool shared_valid = shared_tile < p.row_tiles;
  const int segments = own + (shared_valid ? 1 : 0);
  const int kt0 = int(int64_t(rank) * p.k_tiles / splits);
  const int nk = int(int64_t(rank + 1) * p.k_tiles / splits) - kt0;
  auto seg_tile = [&](int s) { return s < own ? own_first + s : shared_tile; };
  auto seg_k0 = [&](int s) { return s < own ? 0 : kt0; };
  auto seg_nk = [&](int s) { return s < own ? p.k_tiles : nk; };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      ClusterBarrier::init(&full[s], 1);   // the producer's arrive (plus the TMA bytes)
      ClusterBarrier::init(&empty[s], 4);  // one arrive per consumer warp
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int r0 = 16 * (warp & 3) + lane / 4;  // this thread's first row in each 64-row block
  const int c0 = 2 * (lane % 4);              // and its first token column in each 8-column group
  // Warp-uniform as far as the compiler can tell (a shuffle's result), so that the register-sourced
  // wgmmas of the W8A16 form are not serialized as if they sat in a divergent branch.
  const bool consumer = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) == 0;
  float acc[kBlocks][kAcc];
  // Epilogue operands, loaded before each main loop (zeroed here only so that `store` may capture them).
  float sa[TOK / 8][2] = {}, sb[kBlocks][2] = {}, bias[kBlocks][2] = {};
  // scale_a[m] scale_b[n] acc + bias[n] for accumulator j of block b (wgmma layout), with sb and bias
  // loaded for the tile; its token (m) and weight row (n) inside the tile.
  auto epilogue = [&](int b, int j, float v) {
    return from_f32<OutT>(fmaf(sa[j / 4][j % 2] * sb[b][(j / 2) % 2], v, bias[b][(j / 2) % 2]));
  };
  auto tile_m = [&](int j) { return 8 * (j / 4) + c0 + j % 2; };
  auto tile_n = [&](int b, int j) { return 64 * b + r0 + 8 * ((j / 2) % 2); };
  // One output straight to global memory (the split-K path: each CTA stores a share of the entries).
  auto store = [&](int tile, int b, int j, float v) {
    const int n = tile * ROWS + tile_n(b, j), m = tok_tile * TOK + tile_m(j);
    if (n < p.N && m < p.M) static_cast<OutT*>(p.out)[int64_t(m) * p.ldo + n] = epilogue(b, j, v);
  };
  // A whole tile of outputs through the staging area beyond the ring, one 64-row block at a time:
  // each thread writes its accumulators there, then the block's token rows leave as 16-byte pieces,
  // consecutive threads covering a row. (qb_scaled_mm guarantees what the pieces need: N a multiple
  // of 16, out and its row stride 16-byte aligned.) Scattered 2-byte stores straight from the wgmma
  // layout cost about twice the sectors.
  OutT* staged = reinterpret_cast<OutT*>(ring + p.stages * kStageBytes);
  auto store_tile = [&](int tile, bool reused) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      if (reused || b > 0) consumer_barrier();  // the previous block's pieces have left
#pragma unroll
      for (int j = 0; j < kAcc; ++j) staged[tile_m(j) * kStagedPitch + tile_n(0, j)] = epilogue(b, j, acc[b][j]);
      consumer_barrier();
      for (int i = threadIdx.x; i < TOK * 8; i += 128) {
        const int ml = i / 8, nl = 8 * (i % 8);
        const int m = tok_tile * TOK + ml, n = tile * ROWS + 64 * b + nl;
        if (m < p.M && n < p.N)
          *reinterpret_cast<uint4*>(static_cast<OutT*>(p.out) + int64_t(m) * p.ldo + n) =
              *reinterpret_cast<const uint4*>(staged + ml * kStagedPitch + nl);
      }
    }
  };
  if (!consumer) {
    if (lane == 0) {
      cute::prefetch_tma_descriptor(&p.w_map);
      cute::prefetch_tma_descriptor(&p.a_map);
      if (segments > 0) {
        const int pf = seg_nk(0) < kPrefetchTiles ? seg_nk(0) : kPrefetchTiles;
        for (int t = 0; t < pf; ++t)
          cute::SM90_TMA_LOAD_2D::PREFETCH::copy(&p.w_map, (seg_k0(0) + t) * kTileK, seg_tile(0) * ROWS);
      }
      asm volatile("griddepcontrol.wait;" ::: "memory");
      // Only now may the next kernel start: one kernel ahead at most, never a chain of waiting grids.
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
      int stage = 0;
      uint32_t phase = 1;  // a fresh barrier counts its preceding phase as complete: the ring starts empty
      for (int s = 0; s < segments; ++s) {
        const int row = seg_tile(s) * ROWS, k0 = seg_k0(s), n = seg_nk(s);
        for (int t = 0; t < n; ++t) {
          ClusterBarrier::wait(&empty[stage], phase);
          ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage], kStageBytes);
          uint8_t* dst = ring + stage * kStageBytes;
          const int k = (k0 + t) * kTileK;
          cute::SM90_TMA_LOAD_2D::copy(&p.w_map, &full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST), dst,
                                       k, row);
          if constexpr (kMixed) {  // K values k .. k + 63 and k + 64 .. k + 127, 128 bytes each
            cute::SM90_TMA_LOAD_2D::copy(&p.a_map, &full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                         dst + kWBytes, k, tok_tile * TOK);
            cute::SM90_TMA_LOAD_2D::copy(&p.a_map, &full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                         dst + kWBytes + kXHalf, k + kTileK / 2, tok_tile * TOK);
          } else {
            cute::SM90_TMA_LOAD_2D::copy(&p.a_map, &full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST),
                                         dst + kWBytes, k, tok_tile * TOK);
          }
          if (++stage == p.stages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    __syncwarp();
  } else {
    // Scales and bias may come from the previous kernel: read them after it has finished.
    asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
    for (int c = 0; c < TOK / 8; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = tok_tile * TOK + 8 * c + c0 + e;
        sa[c][e] = m >= p.M ? 0.f : kMixed ? 1.f : p.scale_a[p.scale_a_per_row ? m : 0];
      }
    }
    const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
    int stage = 0;
    uint32_t phase = 0;
    for (int s = 0; s < segments; ++s) {
      const int tile = seg_tile(s), n = seg_nk(s);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = tile * ROWS + 64 * b + r0 + 8 * h;
          sb[b][h] = col < p.N ? p.scale_b[p.scale_b_per_col ? col : 0] : 0.f;
          bias[b][h] = col < p.N && p.bias ? to_f32(static_cast<const OutT*>(p.bias)[col]) : 0.f;
        }
      }
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
        for (int j = 0; j < kAcc; ++j) acc[b][j] = 0.f;
        fence_regs(acc[b]);
      }
      int held = -1;
      // W8A16: the converted weight fragments of the stage in flight and of the next one, selected by
      // the stage's parity with compile-time indices only (a runtime index would put them in local
      // memory).
      uint32_t frag[kMixed ? 2 : 1][kTileK / 16][kBlocks][4];
      auto convert_and_issue = [&](auto parity, uint32_t x, const uint8_t* wtile) {
        constexpr int P = decltype(parity)::value;
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
#pragma unroll
          for (int b = 0; b < kBlocks; ++b) load_fragment<OutT>(wtile + b * 64 * kTileK, r0, lane, kk, frag[P][kk][b]);
        }
        cute::warpgroup_arrive();
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          const uint32_t xk = x + (kk / 4) * kXHalf + (kk % 4) * 32;
#pragma unroll
          for (int b = 0; b < kBlocks; ++b)
            gmma_rs<TOK, OutT>(frag[P][kk][b], smem_desc(xk), acc[b], std::make_index_sequence<kAcc>{});
        }
      };
      for (int t = 0; t < n; ++t) {
        ClusterBarrier::wait(&full[stage], phase);
        const uint32_t w = ring_addr + stage * kStageBytes, x = w + kWBytes;
        if constexpr (kMixed) {
          if (t & 1)
            convert_and_issue(std::integral_constant<int, 1>{}, x, ring + stage * kStageBytes);
          else
            convert_and_issue(std::integral_constant<int, 0>{}, x, ring + stage * kStageBytes);
        } else {
          cute::warpgroup_arrive();
#pragma unroll
          for (int kk = 0; kk < kTileK / 32; ++kk) {
#pragma unroll
            for (int b = 0; b < kBlocks; ++b)
              gmma<TOK>(smem_desc(w + b * 64 * kTileK + kk * 32), smem_desc(x + kk * 32), acc[b],
                        std::make_index_sequence<kAcc>{});
          }
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<1>();  // the previous tile's wgmmas are done: its stage may be refilled
        if (held >= 0 && lane == 0) ClusterBarrier::arrive(&empty[held]);
        held = stage;
        if (++stage == p.stages) {
          stage = 0;
          phase ^= 1;
        }
      }
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) fence_regs(acc[b]);
      // Hand the last stage back before the epilogue, so the next segment's loads are not held up.
      if (held >= 0 && lane == 0) ClusterBarrier::arrive(&empty[held]);
      if (s < own || splits == 1) store_tile(tile, s > 0);
    }
  }
  if (splits == 1 || !shared_valid) return;

  // Split-K: each CTA leaves its partial sums in its own (now idle) ring, one float per thread and
  // accumulator, and reduces a contiguous share of the accumulators by reading the same positions
  // from every CTA of the cluster, in rank order. The loop over ranks is unrolled so that all the
  // remote loads are in flight together rather than one round trip after another.
  constexpr int kEntries = kBlocks * kAcc;
  float* part = reinterpret_cast<float*>(ring);
  if (consumer) {
    consumer_barrier();  // all four warps' wgmmas are done with the ring
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) part[(b * kAcc + j) * 128 + threadIdx.x] = acc[b][j];
    }
  }
  cute::cluster_arrive();
  cute::cluster_wait();
  if (consumer) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int e0 = (rank * kEntries + splits - 1) / splits;  // entries e with e * splits / kEntries == rank
    const int e1 = ((rank + 1) * kEntries + splits - 1) / splits;
    float sum[kEntries];
#pragma unroll
    for (int e = 0; e < kEntries; ++e) sum[e] = 0.f;
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q) {
      if (q < splits) {
        const float* src = cluster.map_shared_rank(part, q) + threadIdx.x;
#pragma unroll
        for (int e = 0; e < kEntries; ++e)
          if (e >= e0 && e < e1) sum[e] += src[e * 128];
      }
    }
#pragma unroll
    for (int e = 0; e < kEntries; ++e)
      if (e >= e0 && e < e1) store(shared_tile, e / kAcc, e % kAcc, sum[e]);
  }
  cute::cluster_arrive();  // no CTA leaves while another may still read its shared memory
  cute::cluster_wait();
#endif
}

// ---- host ---------------------------------------------------------------------------------------------

int stage_bytes(int rows, int tokens, int act_bytes) { return (rows + tokens * act_bytes) * kTileK; }
// The staging area for one 64-row block of 2-byte outputs (bf16 or fp16).
int staged_bytes(int tokens) { return tokens * kStagedPitch * 2; }
// The ring (1024-byte aligned, hence the slack) and the staging area after it.
int smem_bytes(int rows, int tokens, int stages, int act_bytes) {
  return stages * stage_bytes(rows, tokens, act_bytes) + 1024 + staged_bytes(tokens);
}

int default_stages(int rows, int tokens, int act_bytes) {
  const int s = (kCtaSmemTarget - 1024 - staged_bytes(tokens)) / stage_bytes(rows, tokens, act_bytes);
  return s < 3 ? 3 : s > kMaxStages ? kMaxStages : s;
}

int token_tile(int64_t M) { return M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : 64; }

SmallMPlan make_plan(const ScaledMmArgs& a, int rows, int splits, int whole) {
  SmallMPlan pl{};
  pl.rows = rows;
  pl.tokens = token_tile(a.M);
  pl.act_bytes = a.a_dtype == QB_BF16 || a.a_dtype == QB_F16 ? 2 : 1;
  pl.stages = default_stages(rows, pl.tokens, pl.act_bytes);
  pl.row_tiles = cdiv(a.N, rows);
  pl.token_tiles = cdiv(a.M, pl.tokens);
  const int64_t k_tiles = cdiv(a.K, kTileK);
  if (splits < 1) splits = 1;
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits > k_tiles) splits = int(k_tiles);
  pl.splits = splits;
  pl.whole = whole < 0 ? 0 : int(std::min<int64_t>(whole, pl.row_tiles));
  pl.clusters = cdiv(pl.row_tiles, int64_t(pl.splits) * pl.whole + 1);
  return pl;
}

// More row tiles than SMs, one CTA per SM at most: each CTA streams cdiv(tiles, sms) tiles through
// its ring, one after the other. (Clusters that also share a tile, to even out the last tiles,
// measured slower on the H200: see small_m_auto_plan.)
SmallMPlan persistent_plan(const ScaledMmArgs& a, int rows, int sms) {
  return make_plan(a, rows, 1, int(cdiv(cdiv(a.N, rows), sms)) - 1);
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D map over a row-major [rows, K] matrix of 1- or 2-byte elements with row stride ld (elements),
// read in boxes of box_rows x 128 bytes with the 128-byte swizzle; rows and columns past the end read
// as zero.
int make_map(CUtensorMap* map, const void* base, int64_t rows, int64_t K, int64_t ld, int elem_bytes, int box_rows,
             const char* what, const Err& err) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return err.set(QB_ERR_CUDA, "sm90 fp8 small-M: the driver does not provide cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld * elem_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(kTileK / elem_bytes), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUtensorMapDataType type = elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  auto encode_map = [&] {
    return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = encode_map();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // A driver call on a thread whose first CUDA work this is: no context is current there yet
    // (runtime calls make one current lazily, driver calls do not). Make the device's primary
    // context current, as the runtime would, and encode again.
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) r = encode_map();
  }
  if (r != CUDA_SUCCESS)
    return err.set(QB_ERR_CUDA, "sm90 fp8 small-M: cuTensorMapEncodeTiled(%s: %lld x %lld, stride %lld) failed: %d",
                   what, (long long)rows, (long long)K, (long long)ld, int(r));
  return QB_OK;
}

template <int ROWS, int TOK, class OutT, bool kMixed>
int launch(const ScaledMmArgs& a, const SmallMPlan& pl, const Params& prm, const Err& err) {
  auto* kernel = small_m_kernel<ROWS, TOK, OutT, kMixed>;
  const int smem = smem_bytes(ROWS, TOK, pl.stages, pl.act_bytes);
  static int allowed[kSmemLimitDevices] = {};  // per kernel instance
  cudaError_t e = allow_dynamic_smem(kernel, smem, allowed);
  if (e != cudaSuccess) return err.cuda(e, "sm90 fp8 small-M: raising the shared-memory limit");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(pl.splits), unsigned(pl.clusters), unsigned(pl.token_tiles));
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = a.stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (pl.splits > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = unsigned(pl.splits);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (a.programmatic) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = unsigned(n);
  e = cudaLaunchKernelEx(&cfg, kernel, prm);
  if (e != cudaSuccess) return err.cuda(e, "sm90 fp8 small-M: kernel launch");
  return QB_OK;
}

template <int ROWS, class OutT, bool kMixed>
int launch_tokens(const ScaledMmArgs& a, const SmallMPlan& pl, const Params& prm, const Err& err) {
  switch (pl.tokens) {
    case 8: return launch<ROWS, 8, OutT, kMixed>(a, pl, prm, err);
    case 16: return launch<ROWS, 16, OutT, kMixed>(a, pl, prm, err);
    case 32: return launch<ROWS, 32, OutT, kMixed>(a, pl, prm, err);
    default: return launch<ROWS, 64, OutT, kMixed>(a, pl, prm, err);
  }
}

// W8A16 runs 64-row tiles only: two stages of converted fragments for 128 rows would not fit in the
// registers next to the accumulators.
template <class OutT>
int launch_rows(const ScaledMmArgs& a, const SmallMPlan& pl, const Params& prm, const Err& err) {
  if (pl.act_bytes == 2) return launch_tokens<64, OutT, true>(a, pl, prm, err);
  return pl.rows == 128 ? launch_tokens<128, OutT, false>(a, pl, prm, err)
                        : launch_tokens<64, OutT, false>(a, pl, prm, err);
}

}  // namespace

// From the H200 sweep in bench/results/scaled_mm_tune_h200.log (run 5), against CUTLASS's swapped
// ping-pong configs under CUDA-graph replay:
// - up to 16 tokens, and up to 32 when N > 4096, this kernel is faster or within 3 % on every shape
//   whose 64-row tiles number at most 4 per SM (all but 57344 x 8192), up to x1.2 (6144 x 4096:
//   7.9 us against 9.6); with 32 tokens on N = 4096 CUTLASS's swapped tiles win;
// - 64-row tiles; but when those would number more than the SMs while 128-row tiles would not
//   (N = 10240: 160 against 80 tiles), 128-row tiles (22.6 us against 27.1 at M = 1);
// - when neither fits on the SMs (N = 28672: 448 and 224 tiles), 64-row tiles, each CTA streaming
//   cdiv(tiles, SMs) of them (112 CTAs of 4 tiles): 30.0 / 30.4 / 31.6 us at M = 1 / 16 / 32 against
//   30.6 / 30.9 / 31.7 for one tile per CTA, and 31.8 to 38.9 for 2 or 3 tiles per CTA (section
//   "Several tiles per CTA for the small-M kernel" of bench/results/scaled_mm_ab_h200.log). Clusters
//   that also split a shared tile's K, for a more even share (2 CTAs over 7 tiles: 3.5 each), took
//   31.1 / 31.6 / 32.8; at N = 10240, clusters of 4 over 5 tiles (1.25 tiles per SM) took 25.9 us
//   at M = 1 against 22.5 for the 128-row tiles (the section after it);
// - split K in two when 64-row tiles cover at most half the SMs and K >= 8192 (4096 x 14336:
//   16.7 us against 18.1 at M = 1); for K = 4096 the reduction costs what the extra SMs gain;
// - 33 to 64 tokens (since the outputs leave through the staging area; bench/ab_libs.py, against the
//   library before, "33 to 64 tokens" in bench/results/scaled_mm_ab_h200.log): on one wave of 64-row
//   tiles, N > 4096 and K <= 8192. 6144 x 4096 took 8.90 / 8.89 us at M = 48 / 64 against 10.02 /
//   9.82 on CUTLASS's swapped 64-token tiles, 8192 x 8192 19.02 / 19.00 against 19.57 / 19.60. Not
//   with a longer K (8192 x 28672: 61.6 / 62.8 against 59.3 / 59.7), likely because with 64 tokens a
//   stage holds as many activation bytes as weight bytes, so the half-SM ring (6 stages) streams a
//   long K more slowly than CUTLASS's 13. Nor on N = 4096 (4096 x 4096 at M = 64, forced: 7.99 us;
//   CUTLASS 6.8).
bool small_m_auto_plan(const ScaledMmArgs& a, SmallMPlan* plan) {
  if (a.M > 64 || (a.M > 16 && a.N <= 4096)) return false;
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  const int64_t tiles64 = cdiv(a.N, 64), tiles128 = cdiv(a.N, 128);
  if (a.M > 32) {
    if (tiles64 > sms || a.K > 8192) return false;
    *plan = make_plan(a, 64, 1, 0);
    return true;
  }
  if (tiles64 > 4 * int64_t(sms)) return false;
  if (tiles64 <= sms)
    *plan = make_plan(a, 64, 2 * tiles64 <= sms && a.K >= 8192 ? 2 : 1, 0);
  else if (tiles128 <= sms)
    *plan = make_plan(a, 128, 1, 0);
  else
    *plan = persistent_plan(a, 64, sms);
  return true;
}

SmallMPlan small_m_forced_plan(const ScaledMmArgs& a, int rows, int splits, int whole) {
  rows = rows == 128 ? 128 : 64;
  if (splits >= 1) return make_plan(a, rows, splits, whole);
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  return cdiv(a.N, rows) > sms ? persistent_plan(a, rows, sms) : make_plan(a, rows, 1, 0);
}

int small_m_run(const ScaledMmArgs& a, const SmallMPlan& pl, const Err& err) {
  if (pl.clusters > 65535 || pl.token_tiles > 65535)
    return err.set(QB_ERR_UNSUPPORTED, "sm90 fp8 small-M: N=%lld and M=%lld need more than 65535 tiles", (long long)a.N,
                   (long long)a.M);
  if (smem_bytes(pl.rows, pl.tokens, pl.stages, pl.act_bytes) > kSmemOptin || pl.stages > kMaxStages ||
      pl.splits < 1 || (pl.act_bytes == 2 && pl.rows != 64))
    return err.set(QB_ERR_UNSUPPORTED, "sm90 small-M: bad plan (rows %d, stages %d, splits %d)", pl.rows, pl.stages,
                   pl.splits);
  Params prm{};
  int st = make_map(&prm.w_map, a.b, a.N, a.K, a.ldb, 1, pl.rows, "weight", err);
  if (st != QB_OK) return st;
  if ((st = make_map(&prm.a_map, a.a, a.M, a.K, a.lda, pl.act_bytes, pl.tokens, "a", err)) != QB_OK) return st;
  prm.out = a.out;
  prm.ldo = a.ldo;
  prm.scale_a = a.scale_a;
  prm.scale_b = a.scale_b;
  prm.bias = a.bias;
  prm.M = int(a.M);
  prm.N = int(a.N);
  prm.k_tiles = int(cdiv(a.K, kTileK));
  prm.row_tiles = int(pl.row_tiles);
  prm.whole = pl.whole;
  prm.stages = pl.stages;
  prm.scale_a_per_row = a.scale_a_per_row;
  prm.scale_b_per_col = a.scale_b_per_col;
  return a.out_dtype == QB_F16 ? launch_rows<__half>(a, pl, prm, err) : launch_rows<__nv_bfloat16>(a, pl, prm, err);
}

}  // namespace qb::sm90
