// marlin_kernel.cuh: the W8A16 kernel template, instantiated by marlin_sm80.cu (ARCH = 80) and
// marlin_sm75.cu (ARCH = 75) inside their own namespaces, so each family has distinct symbols.
//
// Work split. The packed weight is a sequence of U = NT * KT tiles (128 n x 128 k, 16 KiB each),
// tile (t, kt) at index u = t * KT + kt. Block b takes the contiguous run [b * per, (b+1) * per),
// so every block streams one contiguous byte range and all blocks carry the same load (up to one
// tile). A run covers the tail of one output tile-column t, then whole columns, then the head of
// another: each maximal piece with one t is a "segment". A segment spanning all of K writes its
// outputs directly. Otherwise (split-K: only a run's first and last segments) the block stores its
// fp32 partial sums in a workspace slot and goes on streaming; when its run is done it publishes
// its (at most two) slots with one release and bumps their columns' counters, and the block that
// arrives last at a column sums every contributor's slot in block order (deterministic) with all
// its threads, applies the epilogue and resets the counter to 0. No block waits on another, so
// there is no deadlock whatever the residency.
//
// Inside a block. 8 warps: with one or two m16 tiles, warp w works on columns (w & 1) * 64 .. +64
// and on k16 steps (w >> 1) * 2 .. +2 of every tile, for all activation rows (with three or four,
// 32 columns and 4 k16 steps; see Block). Weights go global -> shared (SM80: cp.async into a ring
// of `stages` buffers, each lane copying exactly the pieces it later reads, so each warp runs its
// own pipeline; SM75: registers, two buffers, block barriers), are read back as ready-made B
// fragments with 16-byte loads, decoded in registers (decode_word below) and fed to the tensor
// cores next to A fragments from ldmatrix. At a segment end the k-warps' accumulators are summed
// through shared memory (the buffer just consumed), and the warps of k group 0 run the epilogue:
// * scale, + bias, round to the activation dtype.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "marlin_internal.h"

namespace qbmarlin {
namespace kern {

struct Params {
  const uint8_t* a;  // activations as bytes (row r at a + r * lda_bytes)
  int64_t lda_bytes;
  const uint8_t* w;  // packed tiles
  uint8_t* out;
  int64_t ldo_bytes;
  int M;  // rows of this launch, 1..64
  int N, K;
  int KT;     // k tiles per column
  int per;    // tiles per block
  int units;  // NT * KT
  const float* scale;
  int scale_per_col;
  const uint8_t* bias;  // [N] activation dtype, or null
  float* partials;
  int* counters;
  int stages;  // SM80 ring depth
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- decoding (see qbackend_marlin.h for why it is exact) ---------------------------------------
// Each 32-bit word holds the weights A, B (k0, k0+1) and C, D (k0+8, k0+9) of one column, with their
// sign and 7-bit magnitude fields placed by the prepare kernel for the activation dtype's decode:
// every decoded half2 needs its signs at bits 15 / 31 and its magnitudes at 13..7 / 29..23 (fp16) or
// 10..4 / 26..20 (bf16). A word can hold only one half2's fields where they are wanted; the other
// half2's are moved there by two shifts, each followed by a mask.
// fp16 packing:  bit 15 sign A, 13..7 magnitude A, bit 31 sign B, 29..23 magnitude B (in place),
//                bit 14 sign C, 6..0 magnitude C, bit 30 sign D, 22..16 magnitude D
//                (C, D: signs up by 1, magnitudes up by 7: 5 instructions in all).
// bf16 packing:  bit 15 sign A, 10..4 magnitude A, bit 31 sign B, 26..20 magnitude B (in place),
//                bit 11 sign C, magnitude C bits 3..0 at 3..0 and 6..4 at 14..12,
//                bit 27 sign D, magnitude D bits 3..0 at 19..16 and 6..4 at 30..28
//                (C, D: sign and low magnitude bits up by 4, high magnitude bits down by 4; the bits
//                left free around the in-place pair come in runs of at most 4, too short for a 7-bit
//                magnitude, hence the split). 5 integer instructions and the two multiplies below,
//                where decoding bf16 from the fp16 packing would need 7 and the two multiplies.
template <bool BF16>
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t& ab, uint32_t& cd) {
  if constexpr (!BF16) {
    // fp16: the decoded halves are the weights times 2^-8 (fp16 subnormals included, which the tensor
    // cores take as they are); the epilogue multiplies the fp32 sums by 2^8 (decode_scale).
    ab = w & 0xBF80BF80u;
    cd = ((w << 7) & 0x3F803F80u) | ((w << 1) & 0x80008000u);
  } else {
    // bf16: the halves are the weights times 2^-120; that factor cannot move to the epilogue
    // (a * w * 2^-120 would leave the fp32 normal range in the products), so one bf16x2 multiply per
    // half2 restores the value.
    const uint32_t x = w & 0x87F087F0u;
    const uint32_t y = ((w << 4) & 0x80F080F0u) | ((w >> 4) & 0x07000700u);
    const uint32_t k2p120 = 0x7B807B80u;  // bf16 2^120 in both halves
    const uint32_t mzero = 0x80008000u;   // -0: x * c + (-0) == x * c exactly, signed zeros kept
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(ab) : "r"(x), "r"(k2p120), "r"(mzero));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(cd) : "r"(y), "r"(k2p120), "r"(mzero));
  }
}

// What the fp32 sums of fp16 decodes are multiplied by in the epilogue (see decode_word).
template <bool BF16>
__device__ __forceinline__ float decode_scale() {
  return BF16 ? 1.f : 256.f;
}

// ---- tensor core and shared-memory helpers ------------------------------------------------------
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <bool BF16, int ARCH>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (ARCH >= 80) {
    if constexpr (BF16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  } else {
    static_assert(!BF16 || ARCH >= 80, "sm_75 has no bf16 MMA");
    // m16n8k16 as two m16n8k8: k 0..7 uses A fragments {a0, a1} and b0, k 8..15 {a2, a3} and b1.
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
  }
}

// SM80 asynchronous copies (L2 only: each weight byte is used once). No L2 cache-policy hint: with a
// createpolicy descriptor the H200's JIT of the compute_80 PTX produced LDGSTS that fault with
// "illegal instruction" (seen 2026-11-30, driver 580.159.04).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 source bytes: the 16 destination bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// Wait until at most n groups are pending (n is a run-time value: the ring depth minus 2).
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    case 7: cp_async_wait<7>(); break;
    case 8: cp_async_wait<8>(); break;
    case 9: cp_async_wait<9>(); break;
    default: cp_async_wait<10>(); break;
  }
}

__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ float2 ldcg_f2(const float* p) { return __ldcg(reinterpret_cast<const float2*>(p)); }

// v, made opaque to the compiler where this is called: what is computed from it cannot move above
// that point (a volatile asm stays behind the barriers and fences before it).
__device__ __forceinline__ uint32_t pinned(uint32_t v) {
  asm volatile("" : "+r"(v));
  return v;
}

template <bool BF16>
__device__ __forceinline__ float2 act2_to_float2(uint32_t v) {
  float2 r;
  if constexpr (BF16) {
    r.x = __uint_as_float(v << 16);
    r.y = __uint_as_float(v & 0xFFFF0000u);
  } else {
    asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
        : "=f"(r.x), "=f"(r.y)
        : "r"(v));
  }
  return r;
}

template <bool BF16>
__device__ __forceinline__ uint32_t float2_to_act2(float x, float y) {
  uint32_t r;
  if constexpr (BF16) {
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(x), "f"(y));  // high half = y
  } else {
    asm("{\n .reg .f16 l, h;\n cvt.rn.f16.f32 l, %1;\n cvt.rn.f16.f32 h, %2;\n mov.b32 %0, {l, h};\n}\n"
        : "=r"(r)
        : "f"(x), "f"(y));
  }
  return r;
}

// ---- optional timeline trace (development builds only) ------------------------------------------
// Built with -DQB_MARLIN_TRACE (build_standalone.sh OUT -DQB_MARLIN_TRACE), thread 0 of each of the
// first kTraceBlocks blocks records %globaltimer (ns, comparable across multiprocessors) at fixed
// points of its life; bench/probe_marlin.py --trace reads them back through qb_marlin_trace_read.
// Slots: 0 entry, 1..kTraceTiles the moment tile i's data is ready in warp 0, kSlotLoopEnd when the
// last tile is computed, kSlotReduce when it starts summing a split column as its last contributor
// (0 if it never does), kSlotEnd at exit, kSlotInfo = smid | segments << 16.
#if defined(QB_MARLIN_TRACE)
constexpr int kTraceBlocks = 1024;
constexpr int kTraceTiles = 32;
constexpr int kSlotLoopEnd = kTraceTiles + 1;
constexpr int kSlotReduce = kTraceTiles + 2;
constexpr int kSlotEnd = kTraceTiles + 3;
constexpr int kSlotInfo = kTraceTiles + 4;
// clock64 (SM cycles) at kernel entry and exit, and at the steps of the last finish_segment
constexpr int kSlotClkEntry = kTraceTiles + 5;
constexpr int kSlotClkFinish = kTraceTiles + 6;  // 6 steps: entry, warps met, k reduced, stored, counted, epilogue
constexpr int kSlotClkEnd = kTraceTiles + 12;
constexpr int kTraceSlots = kTraceTiles + 13;
static __device__ unsigned long long g_trace[kTraceBlocks * kTraceSlots];  // one per family TU
__device__ __forceinline__ void trace_at(int slot, unsigned long long v) {
  if (threadIdx.x == 0 && blockIdx.x < kTraceBlocks) g_trace[blockIdx.x * kTraceSlots + slot] = v;
}
__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define QB_TRACE_TIME(slot) trace_at((slot), trace_now())
#define QB_TRACE_VALUE(slot, v) trace_at((slot), (v))
#define QB_TRACE_CLOCK(slot) trace_at((slot), clock64())
#else
#define QB_TRACE_TIME(slot) ((void)0)
#define QB_TRACE_VALUE(slot, v) ((void)0)
#define QB_TRACE_CLOCK(slot) ((void)0)
#endif

// ---- the kernel ---------------------------------------------------------------------------------
template <int MT>
struct Shape {
  static constexpr int kARowBytes = kTileK * 2;             // one fp16/bf16 row of a tile: 256 B
  static constexpr int kABytes = MT * 16 * kARowBytes;      // A rows of one stage
  static constexpr int kStageBytes = kTileBytes + kABytes;  // weights first, then A
  static_assert(MT * 16 * kTileN * 4 <= kStageBytes, "reduction buffer must fit one stage");
};

template <int MT, bool BF16, int ARCH>
struct Block {
  using S = Shape<MT>;
  // Warp grid: WN warps along n x WK along k. With 1-2 m16 tiles a warp takes 64 columns (JN = 8
  // n8 blocks) and 2 of the 8 k16 steps of a tile; with 3-4 m16 tiles it takes 32 columns and 4 k16
  // steps, which halves the accumulators (MT * JN * 4 floats per thread) and keeps them in registers.
  static constexpr int WN = MT <= 2 ? 2 : 4;
  static constexpr int WK = 8 / WN;
  static constexpr int JN = 16 / WN;   // n8 blocks per warp
  static constexpr int KSW = 8 / WK;   // k16 steps per warp per tile
  static constexpr int PIECES = JN / 4;  // 16-byte weight pieces per lane per k16 step
  const Params& p;
  uint8_t* smem;
  int tid, lane, wn, wk;
  float acc[MT][JN][4];

  __device__ __forceinline__ Block(const Params& p_, uint8_t* smem_) : p(p_), smem(smem_) {
    tid = threadIdx.x;
    lane = tid & 31;
    wn = (tid >> 5) % WN;
    wk = (tid >> 5) / WN;
  }

  __device__ __forceinline__ void zero_acc() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < JN; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][j][r] = 0.f;
  }

  // A chunk (row, 16-byte piece) of a stage goes to piece (ch ^ (row & 7)) of its 256-byte row, so
  // the eight row addresses of each ldmatrix hit eight different bank groups.
  __device__ __forceinline__ static uint32_t a_offset(int row, int ch) {
    return static_cast<uint32_t>(row * S::kARowBytes + ((ch ^ (row & 7)) << 4));
  }

  // Index (in 16-byte pieces inside a tile) of piece pc of this lane's fragments for its k16 step s:
  // fragment block fb = (n half h, k16 step) holds 64 pieces, 32 columns (one piece per lane) each.
  __device__ __forceinline__ int w_piece(int s, int pc) const {
    const int h = WN == 2 ? wn : (wn >> 1);
    const int c0 = WN == 2 ? 0 : (wn & 1);
    return (h * 8 + wk * KSW + s) * 64 + (c0 + pc) * 32 + lane;
  }

  // Column (inside the 128-wide tile) of n8 block j of this warp.
  __device__ __forceinline__ int col0(int j) const { return wn * (JN * 8) + j * 8; }

  // Weights and activations of one tile, from shared memory into the accumulators.
  __device__ __forceinline__ void compute(const uint8_t* stage) {
    const uint4* wsm = reinterpret_cast<const uint4*>(stage);
    const uint32_t a_base = smem_addr(stage + kTileBytes);
    const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int lch = lane >> 4;
#pragma unroll
    for (int s = 0; s < KSW; ++s) {
      const int ks = wk * KSW + s;  // k16 step inside the tile
      uint4 q[PIECES];
#pragma unroll
      for (int pc = 0; pc < PIECES; ++pc) q[pc] = wsm[w_piece(s, pc)];
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm_x4(af[mt], a_base + a_offset(mt * 16 + lrow, ks * 2 + lch));
#pragma unroll
      for (int j = 0; j < JN; ++j) {
        const uint4& qq = q[j >> 2];
        const uint32_t word = (j & 3) == 0 ? qq.x : (j & 3) == 1 ? qq.y : (j & 3) == 2 ? qq.z : qq.w;
        uint32_t b0, b1;
        decode_word<BF16>(word, b0, b1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma16816<BF16, ARCH>(acc[mt][j], af[mt], b0, b1);
      }
    }
  }

  // The epilogue's operands for output columns n, n + 1: their scales and bias pair. They are loaded
  // before the barriers (a segment's k sum) or fences (the hand-over) that come before their use, so
  // that the loads overlap those. But an instruction that reads a load's register, even a
  // predicated-off one, waits for the load there: about 1 us with the memory system full (the k sum
  // of a whole column waited 1.08 us at its barrier so; trial X).
  //
  // With one or two m16 tiles (kLateOperandReads) nothing reads them before their use. They stay as
  // loaded (RawPair), with no branch or select on them: columns past N (N % 8 == 0) load the last
  // pair inside, which they never use, and with no bias the bias load reads the scale instead. The
  // decode factor multiplies the sums, not the scales, and the bias is converted from behind
  // `pinned`, which keeps the compiler from hoisting the conversion above the barrier.
  //
  // The three- and four-tile instances keep the form that prepares the operands as they load
  // (ReadyPair): with the late form they ran 2 to 29 % slower at M = 64 and 128 (A/B, trial X), for
  // no reason found in their code (no spills; see kEarlyContributors for such moves before). Their
  // loads below are written as they were before the late form, down to where the hand-over works
  // out its column offset: so written, their machine code (sm_80, sm_75, and sm_90 from the
  // compute_80 PTX) is the same as before, instruction for instruction.
  static constexpr bool kLateOperandReads = MT <= 2;

  struct RawPair {
    float s0, s1;
    uint32_t bias;  // the bias pair's bits in the activation dtype
  };
  struct ReadyPair {
    float2 scale;  // times the decode factor (a power of two, so acc * scale is rounded once)
    float2 bias;
  };
  using PairOperands = typename std::conditional<kLateOperandReads, RawPair, ReadyPair>::type;

  __device__ __forceinline__ PairOperands load_pair(int n) const {
    if constexpr (kLateOperandReads) {
      const int c = min(n, p.N - 2);
      const float* s = p.scale + (p.scale_per_col ? c : 0);
      const void* b = p.bias ? static_cast<const void*>(p.bias + 2 * (int64_t)c) : static_cast<const void*>(p.scale);
      return RawPair{__ldg(s), __ldg(s + (p.scale_per_col ? 1 : 0)), __ldg(static_cast<const uint32_t*>(b))};
    } else {
      ReadyPair o{make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
      if (n >= p.N) return o;  // N % 8 == 0: n < N implies n + 1 < N
      const float s0 = __ldg(p.scale + (p.scale_per_col ? n : 0));
      const float s1 = __ldg(p.scale + (p.scale_per_col ? n + 1 : 0));
      o.scale = make_float2(s0 * decode_scale<BF16>(), s1 * decode_scale<BF16>());
      if (p.bias) o.bias = act2_to_float2<BF16>(__ldg(reinterpret_cast<const uint32_t*>(p.bias + 2 * (int64_t)n)));
      return o;
    }
  }

  __device__ __forceinline__ float2 bias_of(const PairOperands& o) const {
    if constexpr (kLateOperandReads) {
      return p.bias ? act2_to_float2<BF16>(pinned(o.bias)) : make_float2(0.f, 0.f);
    } else {
      return o.bias;
    }
  }

  // One output pair: the sums (x, y) times the decode factor times the scales, plus the bias, rounded
  // once (in the fma) and then to the activation dtype.
  __device__ __forceinline__ static uint32_t out_pair(const PairOperands& o, float2 bias, float x, float y) {
    if constexpr (kLateOperandReads) {
      return float2_to_act2<BF16>(fmaf(x * decode_scale<BF16>(), o.s0, bias.x),
                                  fmaf(y * decode_scale<BF16>(), o.s1, bias.y));
    } else {
      return float2_to_act2<BF16>(fmaf(x, o.scale.x, bias.x), fmaf(y, o.scale.y, bias.y));
    }
  }

  // The pairs of the columns of tile t this lane writes, loaded when a segment ends, before its
  // reduction, so the loads overlap it.
  struct EpilogueOperands {
    PairOperands pair[JN];
  };

  __device__ __forceinline__ void load_epilogue_operands(int t, EpilogueOperands& e) const {
    const int q = lane & 3;
#pragma unroll
    for (int j = 0; j < JN; ++j) {
      const int n = t * kTileN + col0(j) + 2 * q;
      if constexpr (kLateOperandReads) {
        e.pair[j] = load_pair(n);
      } else {  // as load_pair, but with a branch on the scale's granularity (see kLateOperandReads)
        ReadyPair& o = e.pair[j];
        o.scale = make_float2(0.f, 0.f);
        o.bias = make_float2(0.f, 0.f);
        if (n >= p.N) continue;  // N % 8 == 0: n < N implies n + 1 < N
        if (p.scale_per_col) {
          o.scale = make_float2(__ldg(p.scale + n), __ldg(p.scale + n + 1));
        } else {
          const float s = __ldg(p.scale);
          o.scale = make_float2(s, s);
        }
        o.scale.x *= decode_scale<BF16>();
        o.scale.y *= decode_scale<BF16>();
        if (p.bias) o.bias = act2_to_float2<BF16>(__ldg(reinterpret_cast<const uint32_t*>(p.bias + 2 * (int64_t)n)));
      }
    }
  }

  // out = acc * scale + bias for the columns of tile t this warp owns (wk == 0 warps only).
  __device__ __forceinline__ void epilogue(int t, const EpilogueOperands& e) {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int j = 0; j < JN; ++j) {
      const int n = t * kTileN + col0(j) + 2 * q;
      if (n >= p.N) continue;  // N % 8 == 0: n < N implies n + 1 < N
      const float2 bias = bias_of(e.pair[j]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = mt * 16 + g + hh * 8;
          if (r < p.M) {
            const uint32_t v = out_pair(e.pair[j], bias, acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]);
            *reinterpret_cast<uint32_t*>(p.out + r * p.ldo_bytes + 2 * (int64_t)n) = v;
          }
        }
      }
    }
  }

  __device__ __forceinline__ int red_index(int mt, int j) const { return ((wn * MT + mt) * JN + j) * 32 + lane; }

  // Summing the k groups' accumulators at a segment's end goes through the stage just consumed: in
  // two rounds where two buffers of the block's accumulators fit in it (one m16 tile, four k
  // groups), else in WK - 1 rounds through one buffer.
  static constexpr int kRedBuf = WN * MT * JN * 32;  // float4s: every lane's accumulators of one k group
  static constexpr bool kTreeSum = WK == 4 && 2 * kRedBuf * 16 <= S::kStageBytes;
  static_assert(kRedBuf * 16 <= S::kStageBytes, "reduction buffer must fit one stage");

  __device__ __forceinline__ void store_acc(float4* buf) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < JN; ++j)
        buf[red_index(mt, j)] = make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
  }

  __device__ __forceinline__ void add_acc(const float4* buf) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < JN; ++j) {
        const float4 o = buf[red_index(mt, j)];
        acc[mt][j][0] += o.x;
        acc[mt][j][1] += o.y;
        acc[mt][j][2] += o.z;
        acc[mt][j][3] += o.w;
      }
  }

  // Called by all threads after the tile that ends a segment was computed from `stage`: sums the
  // k groups' accumulators through shared memory; a segment spanning all of K then runs its
  // epilogue, any other stores its fp32 partial sums in the block's workspace slot for column t
  // (published later, by publish_and_reduce, once per block).
  // dry: the kernel's first pass, with no tile computed (see kDryPass): only the k sum, on zeros.
  __device__ __forceinline__ void finish_segment(uint8_t* stage, int t, bool full, int u0, bool dry) {
    float4* red = reinterpret_cast<float4*>(stage);
    EpilogueOperands e;
    QB_TRACE_CLOCK(kSlotClkFinish);
    if (wk == 0 && full) load_epilogue_operands(t, e);
    __syncthreads();  // every warp is done reading `stage`
    QB_TRACE_CLOCK(kSlotClkFinish + 1);
    if constexpr (kTreeSum) {
      // two rounds: k groups 2, 3 hand their sums to 0, 1 (buffers 0, 1), then 1 hands to 0 (buffer 1,
      // which group 1 itself read: each lane reads and writes only its own elements)
      if (wk >= 2) store_acc(red + (wk - 2) * kRedBuf);
      __syncthreads();
      if (wk < 2) add_acc(red + wk * kRedBuf);
      if (wk == 1) store_acc(red + kRedBuf);
      __syncthreads();
      if (wk != 0) return;
      add_acc(red + kRedBuf);
    } else {
      // one group after the other into one buffer: the highest first, each adding what is there
#pragma unroll
      for (int step = WK - 1; step >= 1; --step) {
        if (wk == step) {
          if (step != WK - 1) add_acc(red);
          store_acc(red);
        }
        __syncthreads();
      }
      if (wk != 0) return;
      add_acc(red);
    }
    // the WN warps with wk == 0 (threads 0 .. 32 * WN - 1) from here on
    QB_TRACE_CLOCK(kSlotClkFinish + 2);
    if (dry) return;
    if (full) {
      epilogue(t, e);
      return;
    }
    const int g = lane >> 2, q = lane & 3;
    float* part = p.partials + (size_t)slot_of(blockIdx.x, t, u0 / p.KT) * kPartialFloats;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < JN; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = mt * 16 + g + hh * 8;
          if (r < p.M)
            __stcg(reinterpret_cast<float2*>(part + r * kTileN + col0(j) + 2 * q),
                   make_float2(acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]));
        }
    QB_TRACE_CLOCK(kSlotClkFinish + 3);
  }

  // A block's two partial slots: one for the column its run starts in, one for the column it ends in.
  __device__ __forceinline__ static int slot_of(int b, int t, int first_t) { return 2 * b + (t == first_t ? 0 : 1); }

  // A split column's contributors, blocks [first, last], and the first one's partial slot: every
  // other contributor's run starts in this column, so its sums are in slot 2b.
  struct Contributors {
    int first, last, first_slot;
  };
  __device__ __forceinline__ Contributors contributors(int t) const {
    Contributors c;
    c.first = (t * p.KT) / p.per;
    c.last = ((t + 1) * p.KT - 1) / p.per;
    c.first_slot = 2 * c.first + (c.first * p.per < t * p.KT ? 1 : 0);
    return c;
  }
  // With one or two m16 tiles the contributors are worked out before the release, where their
  // divisions overlap the loads of the epilogue's operands, and the sum needs no division per
  // contributor: the last contributor's column sum went from 0.87 to 0.61 us (4096 x 4096, M = 1;
  // trial V). The three- and four-tile instances keep the divisions after the counter: with the early
  // form their (identical but rescheduled) streaming loop ran 9 to 27 % slower on the H200.
  static constexpr bool kEarlyContributors = MT <= 2;

  // Called by all threads once the block's run is done, with the (at most two) split columns it
  // stored partial sums for. Deferring this to the end keeps a split-K hand-over in the middle of a
  // run from stalling the stream: the partial sums' stores complete while later tiles are computed,
  // and the block pays for one release and one counter round trip in all. Then the last
  // contributor of each column sums every contributor's slot in block order (deterministic) with
  // all its threads, runs the epilogue and resets the counter to 0 for the next launch.
  //
  // The column sums are shared out by float pair: thread tid takes the pair at columns
  // 2 * (tid % 64), +1 of rows tid / 64, + 4, + 8, ... (< M), reading the slots row-major as they
  // were written, so each thread needs one pair of scales and biases per column, loaded here before
  // the round trips so that they are in registers by the time the sums are (see PairOperands).
  static constexpr int kRowsPerThread = MT * 16 / (kThreads / (kTileN / 2));
  static constexpr int kReduceBatch = MT <= 2 ? 4 : 2;  // contributors whose loads are in flight together

  __device__ __forceinline__ void publish_and_reduce(int pend0, int pend1, int npend, int* s_last) {
    PairOperands e0{}, e1{};
    Contributors c0{}, c1{};
    // each at this thread's pair of a column sum (reduce_column), worked out in place (kLateOperandReads)
    if (npend > 0) e0 = load_pair(pend0 * kTileN + 2 * (tid % (kTileN / 2)));
    if (npend > 1) e1 = load_pair(pend1 * kTileN + 2 * (tid % (kTileN / 2)));
    if constexpr (kEarlyContributors) {
      if (npend > 0) c0 = contributors(pend0);
      if (npend > 1) c1 = contributors(pend1);
    }
    __syncthreads();  // the partial sums' stores of every warp come before thread 0's release below
    if (tid == 0) {
      // release (fence, then relaxed adds), then acquire (fence) for the columns this block sums
      asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
      int prev[2] = {0, 0};
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (k < npend)
          asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;\n"
                       : "=r"(prev[k])
                       : "l"(p.counters + (k == 0 ? pend0 : pend1))
                       : "memory");
      asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (k < npend) {
          const int t = k == 0 ? pend0 : pend1;
          if constexpr (kEarlyContributors) {
            const Contributors& c = k == 0 ? c0 : c1;
            s_last[k] = prev[k] == c.last - c.first;
          } else {
            // written out: through contributors(t) the bf16 three- and four-tile PTX changes
            s_last[k] = prev[k] == ((t + 1) * p.KT - 1) / p.per - (t * p.KT) / p.per;
          }
        }
    }
    __syncthreads();
    QB_TRACE_CLOCK(kSlotClkFinish + 4);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (k >= npend || !s_last[k]) continue;
      const int t = k == 0 ? pend0 : pend1;
      QB_TRACE_TIME(kSlotReduce);
      reduce_column(t, k == 0 ? e0 : e1, k == 0 ? c0 : c1);
      QB_TRACE_CLOCK(kSlotClkFinish + 5);
      if (tid == 0) atomicExch(p.counters + t, 0);  // ready for the next launch
    }
  }

  // `early`: the column's contributors when kEarlyContributors, else unused.
  __device__ __forceinline__ void reduce_column(int t, const PairOperands& e, const Contributors& early) {
    const Contributors cb = kEarlyContributors ? early : contributors(t);
    const int b_first = cb.first, b_last = cb.last;
    const int col = 2 * (tid % (kTileN / 2));
    const int row0 = tid / (kTileN / 2);
    constexpr int kRowStep = kThreads / (kTileN / 2);
    const bool col_ok = t * kTileN + col < p.N;
    float2 sum[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) sum[i] = make_float2(0.f, 0.f);
    for (int bb = b_first; bb <= b_last; bb += kReduceBatch) {
      float2 v[kReduceBatch][kRowsPerThread];
#pragma unroll
      for (int c = 0; c < kReduceBatch; ++c) {
        const int b = bb + c;
        const int slot = kEarlyContributors ? (b == b_first ? cb.first_slot : 2 * b)
                                            : slot_of(b, t, (b * p.per) / p.KT);
        const float* src = p.partials + (size_t)slot * kPartialFloats + col;
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int r = row0 + i * kRowStep;
          v[c][i] = (b <= b_last && r < p.M && col_ok) ? ldcg_f2(src + r * kTileN) : make_float2(0.f, 0.f);
        }
      }
#pragma unroll
      for (int c = 0; c < kReduceBatch; ++c)
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          sum[i].x += v[c][i].x;
          sum[i].y += v[c][i].y;
        }
    }
    if (!col_ok) return;
    const int64_t n = t * kTileN + col;
    const float2 bias = bias_of(e);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = row0 + i * kRowStep;
      if (r < p.M)
        *reinterpret_cast<uint32_t*>(p.out + r * p.ldo_bytes + 2 * n) = out_pair(e, bias, sum[i].x, sum[i].y);
    }
  }
};

// Blocks per multiprocessor the register budget is sized for: two for one m16 tile on the SM80
// family (a second resident block hides the per-tile barrier and load-to-use latencies of the
// first), one otherwise.
template <int MT, int ARCH>
struct Occupancy {
  static constexpr int kMinBlocks = (ARCH >= 80 && MT == 1) ? 2 : 1;
};

// STAGES: the SM80 ring depth built into the kernel, or 0 for the depth in p.stages. With a depth
// known at compile time the per-tile cp.async wait takes its count as an immediate; with a run-time
// one the compiler makes it a jump table (two constant loads and an indirect branch on every tile),
// which cost one m16 tile's launches 1 to 2 % on the H200. host::launch picks the built-in depths the
// automatic choice uses.
template <int MT, bool BF16, int ARCH, int STAGES>
__global__ void __launch_bounds__(kThreads, (Occupancy<MT, ARCH>::kMinBlocks)) marlin_mm_kernel(const Params p) {
  using S = Shape<MT>;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_last[2];  // whether this block sums each of its split columns (publish_and_reduce)
  Block<MT, BF16, ARCH> blk(p, smem);
  QB_TRACE_TIME(0);
  QB_TRACE_CLOCK(kSlotClkEntry);
  blk.zero_acc();

  const int tid = threadIdx.x;
  const int u0 = blockIdx.x * p.per;
  const int n = min(p.units, u0 + p.per) - u0;
  int seg_kt0 = u0 % p.KT;  // k tile where the current segment started
  // The split columns whose partial sums this block stores: only a run's first and last segments
  // can be split (scalars, not an array, to stay in registers).
  int pend0 = 0, pend1 = 0, npend = 0;
  auto add_pending = [&](int t) {
    if (npend == 0) pend0 = t; else pend1 = t;
    ++npend;
  };

  if constexpr (ARCH >= 80) {
    // Each warp runs its own pipeline: every lane copies (cp.async) exactly the weight pieces it will
    // read itself, so weights need no barrier at all; the WN warps that share k16 steps (one "k group")
    // split the copying of their activation slice and meet at a named barrier once per tile. No
    // block-wide barrier until a segment ends. Loads walk forward with pointer increments: tile u's
    // weights are the 16 KiB after tile u - 1's, and activations move 256 bytes (one k tile) per
    // tile, back to k tile 0 where a new output column starts.
    using B = Block<MT, BF16, ARCH>;
    constexpr int kGroupThreads = 32 * B::WN;
    constexpr int kGroupChunks = 2 * B::KSW;  // 16-byte activation chunks per row of a k group's slice
    const int nst = STAGES > 0 ? STAGES : p.stages;
    const uint32_t ring_bytes = static_cast<uint32_t>(nst * S::kStageBytes);
    const uint32_t smem0 = smem_addr(smem);
    const int wk = blk.wk;
    const int group_lane = blk.wn * 32 + blk.lane;
    const uint8_t* wsrc = p.w + (size_t)u0 * kTileBytes + blk.w_piece(0, 0) * 16;
    const uint32_t wdst = static_cast<uint32_t>(blk.w_piece(0, 0) * 16);
    const uint8_t* arow[MT];  // this lane's activation pieces (row, chunk) at k tile 0
    uint32_t adst[MT];
    int achunk_k[MT];         // the piece's first k inside a k tile
    bool arow_ok[MT];
#pragma unroll
    for (int c = 0; c < MT; ++c) {  // MT * 16 rows x kGroupChunks chunks = MT pieces per group lane
      const int piece = group_lane + c * kGroupThreads;
      const int row = piece / kGroupChunks;
      const int chunk = wk * kGroupChunks + piece % kGroupChunks;
      arow_ok[c] = row < p.M;
      arow[c] = p.a + (arow_ok[c] ? row * p.lda_bytes : 0) + chunk * 16;
      adst[c] = kTileBytes + B::a_offset(row, chunk);
      achunk_k[c] = chunk * 8;
    }
    int lkt = seg_kt0;   // k tile of the next tile to load
    int loads_left = n;  // tiles not yet loaded
    uint32_t wr = 0;     // byte offset of the stage the next load fills
    auto load_next = [&]() {
      if (loads_left > 0) {
        const uint32_t dst = smem0 + wr;
#pragma unroll
        for (int s = 0; s < B::KSW; ++s)
#pragma unroll
          for (int pc = 0; pc < B::PIECES; ++pc)  // w_piece(s, pc) - w_piece(0, 0) = s * 64 + pc * 32
            cp_async_16(dst + wdst + (s * 64 + pc * 32) * 16, wsrc + (s * 64 + pc * 32) * 16);
#pragma unroll
        for (int c = 0; c < MT; ++c) {
          const bool valid = arow_ok[c] && lkt * kTileK + achunk_k[c] < p.K;
          cp_async_16_zfill(dst + adst[c], valid ? arow[c] + lkt * (kTileK * 2) : p.a, valid);
        }
        wsrc += kTileBytes;
        --loads_left;
        lkt = (lkt + 1 == p.KT) ? 0 : lkt + 1;
      }
      wr = (wr + S::kStageBytes == ring_bytes) ? 0 : wr + S::kStageBytes;
      cp_async_commit();  // an empty group past the end keeps the wait count uniform
    };
    for (int s = 0; s < nst - 1; ++s) load_next();
    uint32_t rd = 0;  // byte offset of the stage computed next
    int i = 0, t = u0 / p.KT, kt = seg_kt0;
    // One pass per segment (the run's tiles of one output column): a tight inner loop over its tiles,
    // then the segment's reduction and epilogue.
#if defined(QB_MARLIN_TRACE)
    int trace_segments = 0;
#endif
    // With one m16 tile, where the runs split columns, the first pass is dry: no tiles, only a
    // segment end's k sum, on the zeroed accumulators and through the stage that no load fills before
    // the loop reaches it, while the first tiles are on their way. On the H200 (trial W in
    // marlin_trials_h200.txt) the tiles that follow then stream 0.42 us apart instead of 0.48
    // (4096 x 4096, M = 1), and launches with split columns take 0.4 to 2.7 % less; runs of whole
    // columns were 0.5 to 0.7 % slower with it (28672 x 4096). Why the loop runs faster after it was
    // not found: the loop's compiled code is the same. The two- to four-tile instances keep their
    // code (see kEarlyContributors for how their speed moved with unrelated changes).
    constexpr bool kDryPass = MT == 1;
    bool dry = kDryPass && p.per % p.KT != 0;  // known at run time only, so the pass is not peeled off
    while (dry || i < n) {
      const int seg_len = dry ? 0 : min(n - i, p.KT - kt);
      for (int j = 0; j < seg_len; ++j) {
        // this lane's copies of the tile have landed
        if constexpr (STAGES > 0) cp_async_wait<STAGES - 2>(); else cp_async_wait_dyn(nst - 2);
        // The k group's activation pieces have landed, and every warp of the group is done with the
        // stage the next load refills (it computed from it in the previous iteration).
        named_barrier_sync(2 + wk, kGroupThreads);
#if defined(QB_MARLIN_TRACE)
        if (i + j < kTraceTiles) QB_TRACE_TIME(1 + i + j);
#endif
        load_next();
        blk.compute(smem + rd);
        rd = (rd + S::kStageBytes == ring_bytes) ? 0 : rd + S::kStageBytes;
      }
      uint8_t* last = smem + (rd == 0 ? ring_bytes : rd) - S::kStageBytes;  // the stage just computed
#if defined(QB_MARLIN_TRACE)
      if (i + seg_len == n) QB_TRACE_TIME(kSlotLoopEnd);
      if (!dry) ++trace_segments;
#endif
      const bool full = !dry && kt == 0 && seg_len == p.KT;
      blk.finish_segment(last, t, full, u0, dry);
      if (!dry && !full) add_pending(t);
      blk.zero_acc();
      __syncthreads();  // the reduction buffer (`last`) is read before any warp's next load refills it
      if (dry) {
        dry = false;
        continue;
      }
      i += seg_len;
      ++t;
      kt = 0;
    }
    cp_async_wait<0>();
    blk.publish_and_reduce(pend0, pend1, npend, s_last);
#if defined(QB_MARLIN_TRACE)
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    QB_TRACE_VALUE(kSlotInfo, smid | (trace_segments << 16));
    QB_TRACE_TIME(kSlotEnd);
    QB_TRACE_CLOCK(kSlotClkEnd);
#endif
  } else {
    // Register-staged double buffering: tile i + 1 is in flight in registers while tile i is
    // computed from shared memory.
    uint4 rw[kTileBytes / 16 / kThreads];
    uint4 ra[MT];
    auto fetch = [&](int u, int kt) {
      const uint8_t* src = p.w + (size_t)u * kTileBytes;
#pragma unroll
      for (int c = 0; c < kTileBytes / 16 / kThreads; ++c) rw[c] = ldg_stream(src + (c * kThreads + tid) * 16);
#pragma unroll
      for (int c = 0; c < MT; ++c) {
        const int row = c * 16 + (tid >> 4), ch = tid & 15;
        const int k = kt * kTileK + ch * 8;
        if (row < p.M && k < p.K)
          ra[c] = __ldg(reinterpret_cast<const uint4*>(p.a + row * p.lda_bytes + 2 * (int64_t)k));
        else
          ra[c] = make_uint4(0u, 0u, 0u, 0u);
      }
    };
    auto store = [&](uint8_t* stage) {
      uint4* dw = reinterpret_cast<uint4*>(stage);
#pragma unroll
      for (int c = 0; c < kTileBytes / 16 / kThreads; ++c) dw[c * kThreads + tid] = rw[c];
#pragma unroll
      for (int c = 0; c < MT; ++c) {
        const int row = c * 16 + (tid >> 4), ch = tid & 15;
        *reinterpret_cast<uint4*>(stage + kTileBytes + Block<MT, BF16, ARCH>::a_offset(row, ch)) = ra[c];
      }
    };
    int lkt = seg_kt0;  // k tile of the next tile to fetch
    auto next_lkt = [&]() { lkt = (lkt + 1 == p.KT) ? 0 : lkt + 1; };
    fetch(u0, lkt);
    next_lkt();
    store(smem);
    if (n > 1) fetch(u0 + 1, lkt);
    next_lkt();
    __syncthreads();
    int t = u0 / p.KT, kt = seg_kt0;
    for (int i = 0; i < n; ++i) {
      uint8_t* stage = smem + (i & 1) * S::kStageBytes;
      blk.compute(stage);
      if (kt == p.KT - 1 || i == n - 1) {
        const bool full = seg_kt0 == 0 && kt == p.KT - 1;
        blk.finish_segment(stage, t, full, u0, false);
        if (!full) add_pending(t);
        blk.zero_acc();
        seg_kt0 = 0;
      }
      if (++kt == p.KT) {
        kt = 0;
        ++t;
      }
      if (i + 1 < n) store(smem + ((i + 1) & 1) * S::kStageBytes);
      if (i + 2 < n) fetch(u0 + i + 2, lkt);
      next_lkt();
      __syncthreads();
    }
    blk.publish_and_reduce(pend0, pend1, npend, s_last);
  }
}

// ---- prepare: [N, K] row-major e4m3fn -> packed tiles ------------------------------------------
// The four codes of one word in the packing of the activation dtype (see decode_word).
template <bool BF16>
__device__ __forceinline__ uint32_t place4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  if constexpr (!BF16) {
    return ((a & 0x80u) << 8) | ((a & 0x7Fu) << 7) | ((b & 0x80u) << 24) | ((b & 0x7Fu) << 23) |
           ((c & 0x80u) << 7) | (c & 0x7Fu) | ((d & 0x80u) << 23) | ((d & 0x7Fu) << 16);
  } else {
    return ((a & 0x80u) << 8) | ((a & 0x7Fu) << 4) | ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20) |
           ((c & 0x80u) << 4) | (c & 0x0Fu) | ((c & 0x70u) << 8) |
           ((d & 0x80u) << 20) | ((d & 0x0Fu) << 16) | ((d & 0x70u) << 24);
  }
}

// Where packed word `id` of a weight's packing comes from: its column n and the first k0 of the four
// weights it holds (k0, k0 + 1, k0 + 8, k0 + 9); KT = ceil(K / 128) tiles along k, 4096 words a tile.
__device__ __forceinline__ void word_origin(int64_t id, int KT, int& n, int& k0) {
  const int64_t u = id >> 12;
  const int r = static_cast<int>(id & 4095);
  const int fb = r >> 8, c = (r >> 7) & 1, lane = (r >> 2) & 31, qd = r & 3;
  const int h = fb >> 3, ks = fb & 7;
  const int t = static_cast<int>(u / KT), kt = static_cast<int>(u % KT);
  n = t * kTileN + h * 64 + (c * 4 + qd) * 8 + (lane >> 2);
  k0 = (kt * 8 + ks) * 16 + 2 * (lane & 3);
}

// One thread per packed 32-bit word, in the packing for bf16 or fp16 activations. (ARCH only gives
// each family TU its own symbol.)
template <int ARCH, bool BF16>
__global__ void marlin_prepare_kernel(const uint8_t* __restrict__ w, int64_t ldw, int N, int K, int KT,
                                      uint32_t* __restrict__ packed, int64_t words, int32_t* nan_count) {
  const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int nans = 0;
  if (id < words) {
    int n, k0;
    word_origin(id, KT, n, k0);
    uint32_t v[4] = {0u, 0u, 0u, 0u};
    if (n < N) {
      const uint8_t* row = w + (int64_t)n * ldw;
      const int ks4[4] = {k0, k0 + 1, k0 + 8, k0 + 9};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (ks4[e] < K) {
          v[e] = row[ks4[e]];
          nans += (v[e] & 0x7Fu) == 0x7Fu;
        }
      }
    }
    packed[id] = place4<BF16>(v[0], v[1], v[2], v[3]);
  }
  if (nan_count) {
    // warp-aggregated count, one atomic per warp that saw a NaN
    const unsigned mask = __ballot_sync(0xFFFFFFFFu, nans != 0);
    if (mask) {
      int tot = nans;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xFFFFFFFFu, tot, o);
      if ((threadIdx.x & 31) == 0) atomicAdd(nan_count, tot);
    }
  }
}

// The inverse of marlin_prepare_kernel, for GEMMs too large for the mm kernel's small-M design: one
// thread per packed 32-bit word decodes its four weights as the mm kernel does, multiplies them by
// their column's scale (and the decode factor) in fp32, and writes them rounded to the activation
// dtype into out[n * ldo + k] (k0, k0 + 1 and k0 + 8, k0 + 9 as two 32-bit stores). K is a multiple
// of 16, so a word whose k0 is inside K has all four of its weights inside it.
template <int ARCH, bool BF16>
__global__ void marlin_unpack_kernel(const uint32_t* __restrict__ packed, int N, int K, int KT, int64_t words,
                                     const float* __restrict__ scale, bool scale_per_col,
                                     uint32_t* __restrict__ out, int64_t ldo_words) {
  const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= words) return;
  int n, k0;
  word_origin(id, KT, n, k0);
  if (n >= N || k0 >= K) return;
  uint32_t ab, cd;
  decode_word<BF16>(__ldg(packed + id), ab, cd);
  const float s = __ldg(scale + (scale_per_col ? n : 0)) * decode_scale<BF16>();
  const float2 x = act2_to_float2<BF16>(ab), y = act2_to_float2<BF16>(cd);
  uint32_t* row = out + (int64_t)n * ldo_words;
  row[k0 >> 1] = float2_to_act2<BF16>(x.x * s, x.y * s);
  row[(k0 + 8) >> 1] = float2_to_act2<BF16>(y.x * s, y.y * s);
}

}  // namespace kern
}  // namespace qbmarlin
