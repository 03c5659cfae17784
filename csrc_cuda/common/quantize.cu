// quantize.cu: qb_quantize, FP8 (e4m3, e5m2) and INT8 quantization at memory speed.
//
// Numerics are those of the reference provider, bit for bit:
//   q = saturate(x / scale): IEEE fp32 division (see Divisor: exact, without a division per
//   element), clamp to [-qmax, qmax], then fp8 round-to-nearest-even or int8 rint (half to even)
//   clamped to [-128, 127]; dynamic scale = max(min(amax, *scale_ub) / qmax, 1 / (qmax * 512)).
// Non-finite values follow docs/api.md ("Non-finite values"): the amax propagates NaN (a granule
// holding a NaN gets a NaN scale), an inf gives an inf scale (its finite values become +-0, the
// infinities NaN), a NaN quantizes to 0x7F (e4m3 and e5m2: the sign is dropped, as the reference
// does) and to 0 in int8; a static scale or scale_ub that is not a positive finite number makes
// the scale NaN (and +-inf, 0 or a negative one too), so an invalid scale on the device shows in
// q without a host sync.
// Layout: x[r * ldx + c], q[r * ldq + c]. Rows whose pointer and stride allow it are moved in
// 16-byte loads (VEC elements); anything else takes the same kernels with VEC = 1.
//
// Modes:
//   STATIC_TENSOR  one elementwise pass.
//   DYNAMIC_TOKEN  one fused pass: a block owns a row, keeps it in registers while it reduces the
//                  row's amax, then scales and stores it (rows longer than the register cache are
//                  re-read, from L2 in practice). Few rows get wide blocks (one vector per thread),
//                  many rows narrow ones (up to four): see row_vecs. per_token_pipelined_kernel
//                  (resident blocks that prefetch their next row) is an alternative, slower on the
//                  H200, kept for tuning.
//   DYNAMIC_GROUP  one fused pass: per_row_group_kernel (a block per row, a group's amax reduced over
//                  the lanes that hold it) where a group is a power of two of 16-byte vectors up to
//                  32, per_group_kernel (a warp per group) otherwise.
//   DYNAMIC_TENSOR memset(accumulator) -> amax pass (atomicMax) -> convert pass. The accumulator is
//                  the caller's workspace, or, without one, `scale` itself followed by a one-thread
//                  pass that turns the amax into the scale. No host sync, no allocation: capturable.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdio.h>

#include <algorithm>
#include <type_traits>

#include "qb_common.h"

namespace {

// Per-token kernel: each thread keeps up to kCacheVecs 16-byte vectors of its row in registers, and
// a row gets up to kMaxTokenThreads threads, so rows up to 4096 vectors (32768 bf16) are read once.
constexpr int kCacheVecs = 4;
constexpr int kMaxTokenThreads = 1024;
// How many of those vectors each thread takes (row_vecs below) depends on the input bytes per SM.
// Small inputs are latency-bound: with four vectors per thread, few rows leave one or two warps per
// SM sub-partition, and each thread's chain of divides and conversions runs with nothing to hide its
// latency, so they get the fewest vectors per thread that still fit a row in one block. Large inputs
// are bandwidth-bound, and four vectors per thread (fewer, smaller blocks) move them fastest. H200,
// bf16 -> e4m3, four / two / one vectors per thread (bench/bench_quantize.py --sweep, in
// bench/results/quantize_h200.log): 4096 columns, 16 rows 2.27 / 1.97 / 1.47 us, 768 rows 6.43 /
// 5.89 / 5.49, 1024 rows 6.97 / 6.29 / 6.62, 2048 rows 9.95 / 10.90 / 11.44; 8192 columns, 768
// rows 8.20 / 9.25 / 10.02; 14336 columns (one vector per thread does not fit), 128 rows 4.32 /
// 4.13, 384 rows 8.43 / 9.03.
constexpr int64_t kFewestVecsBytesPerSm = 52 * 1024;  // below: the fewest vectors that fit
constexpr int64_t kTwoVecsBytesPerSm = 72 * 1024;     // below: at most two
// The per-group row kernel keeps two vectors per thread longer (no block barrier to amortise; H100,
// bench/results/quantize_group_row_kernel_trial_h100.log, bf16 groups of 128, one / two / four vectors per thread):
// 1024 x 7168 (111 KB per SM) 12.18 / 11.93 / 12.55 us, 4096 x 2048 (127 KB) 12.53 / 12.26 / 13.75,
// 4096 x 7168 (445 KB) 43.58 / 39.72 / 37.99; below 52 KB one is fastest as per token (16 and 256 x
// 7168: 1.86 / 2.29 / 3.17 and 3.99 / 5.42 / 5.63).
constexpr int64_t kGroupTwoVecsBytesPerSm = 240 * 1024;

template <int QD>
struct QTraits;
template <>
struct QTraits<QB_E4M3> {
  static constexpr float qmax = 448.0f;
};
template <>
struct QTraits<QB_E5M2> {
  static constexpr float qmax = 57344.0f;
};
template <>
struct QTraits<QB_I8> {
  static constexpr float qmax = 127.0f;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __half __low2half_or_bf16(__half2 v) { return __low2half(v); }
__device__ __forceinline__ __half __high2half_or_bf16(__half2 v) { return __high2half(v); }
__device__ __forceinline__ __nv_bfloat16 __low2half_or_bf16(__nv_bfloat162 v) { return __low2bfloat16(v); }
__device__ __forceinline__ __nv_bfloat16 __high2half_or_bf16(__nv_bfloat162 v) { return __high2bfloat16(v); }

// Programmatic dependent launch (sm_90 machine code only; nothing elsewhere). Wait until the previous
// kernel in the stream has finished and its writes are visible (a no-op for an ordinary launch), then
// let the next kernel, if launched as a programmatic dependent (the FP8 GEMM that reads q), start its
// prologue while this one runs; it waits in turn for this kernel before it reads anything.
__device__ __forceinline__ void enter_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// x / s, bit-identical to IEEE fp32 division, in 4 instructions instead of a division subroutine
// (the division's cost made the kernels compute-bound). With r = RN(1/s) and q0 = RN(x r), the
// residual e = x - q0 s is exact (FMA) and RN(q0 + e r) is the correctly rounded quotient
// (Markstein's theorem) whenever nothing over- or underflows: s within [2^-60, 2^60] (checked once
// per scale) and |q0| within [2^-40, 2^60). Above that range (and for NaN / inf) we call
// __fdiv_rn. Below 2^-40 the correction may be off by an ulp, but such a quotient is far below half
// the smallest fp8 / int8 step, so only its sign matters, and copysign keeps it (q0 has the exact
// quotient's sign; a zero q1 could otherwise come out +0 for a negative x). Checked against x / s on
// random pairs on the CPU (tests/test_quantize_division.py), and bit-exact against torch in
// tests/gpu/test_native_quantize.py.
struct Divisor {
  float s, r;
  bool fast;
  // fast, and every x it will divide is finite with |x| <= the amax the scale was made from
  // (a dynamic scale without scale_ub): each quotient is then at most about qmax, so the range
  // check and the NaN handling per element can go (vec_store).
  bool bounded;
  __device__ __forceinline__ float quotient(float x) const {  // the 4-instruction form alone
    const float q0 = __fmul_rn(x, r);
    return copysignf(__fmaf_rn(__fmaf_rn(-q0, s, x), r, q0), q0);
  }
  __device__ __forceinline__ float operator()(float x) const {
    if (fast && fabsf(__fmul_rn(x, r)) < 0x1p60f) return quotient(x);
    return __fdiv_rn(x, s);
  }
};

// from_own_amax: s came from the unclamped amax of the very values it will divide (a NaN or inf
// among them makes s non-finite, so `fast`, and with it `bounded`, is false).
__device__ __forceinline__ Divisor make_divisor(float s, bool from_own_amax = false) {
  const float a = fabsf(s);
  const bool fast = a >= 0x1p-60f && a <= 0x1p60f;  // false for NaN
  return Divisor{s, __frcp_rn(s), fast, fast && from_own_amax};
}

// The byte every NaN quantizes to: the positive NaN of e4m3fn and e5m2 (what torch writes for a
// NaN with the sign bit clear), and 0 for int8, which has no NaN.
template <int QD>
__device__ __forceinline__ uint8_t nan_byte() {
  return QD == QB_I8 ? 0 : 0x7F;
}

// One element, already divided: saturate and convert to the storage byte of the quantized type.
// fp8: the .satfinite conversion maps every finite value beyond qmax to +-qmax, which is exactly
// what clamping to [-qmax, qmax] before rounding gives; a NaN is written as nan_byte (the
// conversion's own NaN may carry the input's sign or another payload). kFinite: v is known finite.
template <int QD, bool kFinite = false>
__device__ __forceinline__ uint8_t quantize_one(float v) {
  if (!kFinite && isnan(v)) return nan_byte<QD>();
  if constexpr (QD == QB_I8) {
    v = rintf(v);  // round half to even, like torch.round
    v = fminf(fmaxf(v, -128.0f), 127.0f);
    return static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(v)));
  } else {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, QD == QB_E4M3 ? __NV_E4M3 : __NV_E5M2));
  }
}

// Two elements at once (one cvt instruction for fp8 pairs on sm_89+).
template <int QD, bool kFinite = false>
__device__ __forceinline__ uint16_t quantize_two(float a, float b) {
  if constexpr (QD == QB_I8) {
    return static_cast<uint16_t>(quantize_one<QD, kFinite>(a) | (uint16_t(quantize_one<QD, kFinite>(b)) << 8));
  } else {
    uint16_t two = static_cast<uint16_t>(
        __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, QD == QB_E4M3 ? __NV_E4M3 : __NV_E5M2));
    if constexpr (kFinite) return two;
    if (isnan(a)) two = static_cast<uint16_t>((two & 0xFF00u) | nan_byte<QD>());
    if (isnan(b)) two = static_cast<uint16_t>((two & 0x00FFu) | (nan_byte<QD>() << 8));
    return two;
  }
}

// max(m, a) for m and a non-negative or NaN (sign bit clear), with NaN winning: such floats order
// like their bit patterns, and every NaN pattern lies above +inf. fmaxf would drop the NaN.
__device__ __forceinline__ float nan_max(float m, float a) {
  return __uint_as_float(max(__float_as_uint(m), __float_as_uint(a)));
}

// A static scale (or scale_ub) that is not positive and finite (NaN, +-inf, 0, negative) becomes
// NaN, so that every q it gives is NaN (0 in int8): the host cannot refuse it without a sync.
__device__ __forceinline__ float checked_static_scale(float s) {
  return (s > 0.0f && s < INFINITY) ? s : __uint_as_float(0x7FC00000u);
}

// Comparisons instead of fminf / fmaxf so that a NaN amax stays NaN (torch.minimum and torch.clamp
// propagate it); a scale_ub that is not positive and finite gives a NaN scale.
template <int QD>
__device__ __forceinline__ float scale_from_amax(float amax, const float* scale_ub) {
  constexpr float qmax = QTraits<QD>::qmax;
  if (scale_ub != nullptr) {
    const float ub = checked_static_scale(*scale_ub);
    amax = isnan(ub) ? ub : (amax > ub ? ub : amax);
  }
  const float min_scale = 1.0f / (qmax * 512.0f);  // constant-folded, exact fp32 rounding of 1/(qmax*512)
  // amax / qmax by Divisor's 4-instruction form (r = RN(1/qmax), constant-folded). Checked against
  // the IEEE division for every finite non-negative fp32 amax and qmax = 448, 57344, 127: equal
  // wherever the quotient is at least 2^-40 (tests/test_quantize_division.py); below, it is
  // clamped to min_scale either way.
  // inf and NaN take the division.
  const Divisor by_qmax{qmax, 1.0f / qmax, true, true};
  const float s = amax < INFINITY ? by_qmax.quotient(amax) : __fdiv_rn(amax, qmax);
  return s < min_scale ? min_scale : s;
}

// VEC consecutive input elements, loaded as one access when VEC * sizeof(T) is 16 bytes.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// VEC quantized bytes stored as one access (1, 2, 4 or 8 bytes).
template <int VEC>
struct alignas(VEC) QVec {
  uint8_t v[VEC];
};

// Streaming (evict-first) accesses for data used once: each input vector is read once, each output
// vector written once. The stores are what pays (H200, bench_quantize.py, per token at 8192 x 4096:
// 32.4 -> 30.1 us, 3.11 -> 3.35 TB/s; at 1024 x 4096, which fits in L2, 6.9 -> 7.2 us; streaming
// loads alone gained little in a trial). Evict-first lines stay in L2 until it needs room, so the
// GEMM that reads the quantized rows next still finds them there when they fit.
template <typename V>
__device__ __forceinline__ V load_once(const V* p) {
  static_assert(sizeof(V) == 16 || sizeof(V) == 8 || sizeof(V) <= 4, "vector size");
  V v;
  if constexpr (sizeof(V) == 16) {
    const uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
    memcpy(&v, &r, 16);
  } else if constexpr (sizeof(V) == 8) {
    const uint2 r = __ldcs(reinterpret_cast<const uint2*>(p));
    memcpy(&v, &r, 8);
  } else {
    v = *p;
  }
  return v;
}

template <typename V>
__device__ __forceinline__ void store_once(V* p, const V& v) {
  if constexpr (sizeof(V) == 16) {
    uint4 r;
    memcpy(&r, &v, 16);
    __stcs(reinterpret_cast<uint4*>(p), r);
  } else if constexpr (sizeof(V) == 8) {
    uint2 r;
    memcpy(&r, &v, 8);
    __stcs(reinterpret_cast<uint2*>(p), r);
  } else {
    *p = v;
  }
}

// max(m, |x|) over a vector, NaN winning (nan_max). 16-bit inputs are compared as packed pairs in
// their own type (a max picks one of its inputs, so this is exact; the _nan form returns NaN when
// either input is one) and kept packed, which also keeps the register cache of the per-token
// kernels at 4 registers per vector. fabsf clears the sign of a NaN, as nan_max needs.
template <typename T, int VEC>
__device__ __forceinline__ float vec_amax(const Vec<T, VEC>& x, float m) {
  if constexpr (std::is_same_v<T, float> || VEC == 1) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) m = nan_max(m, fabsf(to_f32(x.v[j])));
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const T2* p = reinterpret_cast<const T2*>(x.v);
    T2 acc = __habs2(p[0]);
#pragma unroll
    for (int j = 1; j < VEC / 2; ++j) acc = __hmax2_nan(acc, __habs2(p[j]));
    m = nan_max(m, fabsf(to_f32(__low2half_or_bf16(acc))));
    m = nan_max(m, fabsf(to_f32(__high2half_or_bf16(acc))));
  }
  return m;
}

// The pairs of a vector, each element divided by `divide`, into q (kFinite: as quantize_two's).
template <int QD, bool kFinite, typename T, int VEC, typename Divide>
__device__ __forceinline__ void quantize_pairs(const Vec<T, VEC>& x, Divide divide, QVec<VEC>& q) {
#pragma unroll
  for (int j = 0; j < VEC; j += 2) {
    const uint16_t two = quantize_two<QD, kFinite>(divide(to_f32(x.v[j])), divide(to_f32(x.v[j + 1])));
    q.v[j] = static_cast<uint8_t>(two);
    q.v[j + 1] = static_cast<uint8_t>(two >> 8);
  }
}

template <typename T, int VEC, int QD>
__device__ __forceinline__ void vec_store(const Vec<T, VEC>& x, const Divisor& div, uint8_t* dst) {
  QVec<VEC> q;
  if constexpr (VEC == 1) {
    q.v[0] = quantize_one<QD>(div(to_f32(x.v[0])));
  } else if (div.bounded) {  // uniform over the block: one branch per vector, not per element
    quantize_pairs<QD, true>(x, [&](float v) { return div.quotient(v); }, q);
  } else {
    quantize_pairs<QD, false>(x, div, q);
  }
  store_once(reinterpret_cast<QVec<VEC>*>(dst), q);
}

// Max over the block (NaN winning); every thread gets the result. `red` holds one float per warp.
__device__ __forceinline__ float block_max(float m, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = m;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  m = lane < nwarps ? red[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// The x row that output row r quantizes: r itself, or gather[r] (a MoE layer's routed slot reading
// its token's row). An index outside [0, x_rows) cannot be refused without a host sync: the row
// reads x's row 0 instead and its scale is made NaN (poison_if), so the fault shows in the output.
__device__ __forceinline__ int64_t source_row(const int64_t* gather, int64_t r, int64_t x_rows, bool& bad) {
  if (gather == nullptr) {
    bad = false;
    return r;
  }
  const int64_t src = gather[r];
  bad = src < 0 || src >= x_rows;
  return bad ? 0 : src;
}

__device__ __forceinline__ float poison_if(bool bad, float scale) {
  return bad ? __uint_as_float(0x7FC00000u) : scale;
}

__device__ __forceinline__ __half from_f32(float v, __half) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 from_f32(float v, __nv_bfloat16) { return __float2bfloat16_rn(v); }

// The activation of a gated MLP, SiLU(gate) * up, computed as torch computes
// (F.silu(g.float()) * u.float()).to(T) on a GPU: SiLU(g) = g / (1 + exp(-g)) with expf and an
// IEEE division, one fp32 product, one rounding to T. The division and product are spelled as
// rounded intrinsics so that no build flag can make them approximate; expf is only exact to torch's
// without fast math, which this library is built without.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> silu_mul(const Vec<T, VEC>& gate, const Vec<T, VEC>& up) {
  Vec<T, VEC> act;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float g = to_f32(gate.v[j]);
    act.v[j] = from_f32(__fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), to_f32(up.v[j])), T());
  }
  return act;
}

// Vector idx of the row a quantize kernel reads, from p (the row's first vector): the row itself,
// or with kSiluMul the gated activation of a [gate | up] row whose up half starts `up` vectors
// after p. kOnce: a streaming (read-once) load; otherwise an ordinary one, for vectors read twice.
template <typename T, int VEC, bool kSiluMul, bool kOnce>
__device__ __forceinline__ Vec<T, VEC> load_src(const Vec<T, VEC>* p, int64_t idx, int64_t up) {
  if constexpr (kSiluMul) {
    if constexpr (kOnce) return silu_mul<T, VEC>(load_once(p + idx), load_once(p + up + idx));
    else return silu_mul<T, VEC>(p[idx], p[up + idx]);
  } else {
    (void)up;
    if constexpr (kOnce) return load_once(p + idx);
    else return p[idx];
  }
}

// DYNAMIC_TOKEN: block r quantizes row r. nvec = cols / VEC; each thread caches VECS vectors of the
// row in registers (a template parameter: a run-time count would keep registers for kCacheVecs and
// cost the wide blocks their occupancy).
// kSiluMul: x's rows are [gate | up] halves of nvec vectors each, and the row quantized is their
// gated activation (silu_mul).
template <typename T, int VEC, int QD, int VECS, bool kSiluMul>
__global__ void __launch_bounds__(kMaxTokenThreads) per_token_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q,
                                                        int64_t ldq, float* __restrict__ scales, int64_t nvec,
                                                        const float* __restrict__ scale_ub,
                                                        const int64_t* __restrict__ gather, int64_t x_rows) {
  __shared__ float red[32];
  enter_dependent_grid();
  const int64_t r = blockIdx.x;
  bool bad;
  const auto* xr = reinterpret_cast<const Vec<T, VEC>*>(x + source_row(gather, r, x_rows, bad) * ldx);
  uint8_t* qr = q + r * ldq;

  Vec<T, VEC> cache[VECS];
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
    if (idx < nvec) {
      cache[i] = load_src<T, VEC, kSiluMul, true>(xr, idx, nvec);
      m = vec_amax<T, VEC>(cache[i], m);
    }
  }
  for (int64_t idx = threadIdx.x + int64_t(VECS) * blockDim.x; idx < nvec; idx += blockDim.x)
    m = vec_amax<T, VEC>(load_src<T, VEC, kSiluMul, false>(xr, idx, nvec), m);

  const float scale = poison_if(bad, scale_from_amax<QD>(block_max(m, red), scale_ub));
  if (threadIdx.x == 0) scales[r] = scale;
  const Divisor div = make_divisor(scale, scale_ub == nullptr);

#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
    if (idx < nvec) vec_store<T, VEC, QD>(cache[i], div, qr + idx * VEC);
  }
  for (int64_t idx = threadIdx.x + int64_t(VECS) * blockDim.x; idx < nvec; idx += blockDim.x)
    vec_store<T, VEC, QD>(load_src<T, VEC, kSiluMul, false>(xr, idx, nvec), div, qr + idx * VEC);
}

// DYNAMIC_TOKEN, persistent and software-pipelined: a resident block walks rows r, r + grid, ...
// and issues the loads of its next row before it reduces, scales and stores the current one, so
// memory latency overlaps the arithmetic inside each block, not only across blocks. The reduction
// scratch is double-buffered by row parity: one barrier per row suffices.
template <typename T, int VEC>
__device__ __forceinline__ void load_row(const Vec<T, VEC>* xr, int64_t nvec, Vec<T, VEC> (&v)[kCacheVecs]) {
#pragma unroll
  for (int i = 0; i < kCacheVecs; ++i) {
    const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
    if (idx < nvec) v[i] = xr[idx];
  }
}

constexpr int kMaxPipelinedThreads = 256;  // keeps two rows of registers per thread unspilled

template <typename T, int VEC, int QD>
__global__ void __launch_bounds__(kMaxPipelinedThreads)
    per_token_pipelined_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq,
                               float* __restrict__ scales, int64_t rows, int64_t nvec,
                               const float* __restrict__ scale_ub) {
  __shared__ float red[2][32];
  Vec<T, VEC> cur[kCacheVecs], nxt[kCacheVecs];
  int64_t r = blockIdx.x;
  if (r >= rows) return;
  load_row<T, VEC>(reinterpret_cast<const Vec<T, VEC>*>(x + r * ldx), nvec, cur);
  for (int parity = 0; r < rows; r += gridDim.x, parity ^= 1) {
    const int64_t rn = r + gridDim.x;
    if (rn < rows) load_row<T, VEC>(reinterpret_cast<const Vec<T, VEC>*>(x + rn * ldx), nvec, nxt);
    const auto* xr = reinterpret_cast<const Vec<T, VEC>*>(x + r * ldx);
    uint8_t* qr = q + r * ldq;
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) {
      const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
      if (idx < nvec) m = vec_amax<T, VEC>(cur[i], m);
    }
    for (int64_t idx = threadIdx.x + int64_t(kCacheVecs) * blockDim.x; idx < nvec; idx += blockDim.x)
      m = vec_amax<T, VEC>(xr[idx], m);
    const float scale = scale_from_amax<QD>(block_max(m, red[parity]), scale_ub);
    if (threadIdx.x == 0) scales[r] = scale;
    const Divisor div = make_divisor(scale, scale_ub == nullptr);
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) {
      const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
      if (idx < nvec) vec_store<T, VEC, QD>(cur[i], div, qr + idx * VEC);
    }
    for (int64_t idx = threadIdx.x + int64_t(kCacheVecs) * blockDim.x; idx < nvec; idx += blockDim.x)
      vec_store<T, VEC, QD>(xr[idx], div, qr + idx * VEC);
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) cur[i] = nxt[i];
  }
}

// DYNAMIC_GROUP where per_row_group_kernel does not apply (a group of more than 32 16-byte vectors or
// of a count that is not a power of two, and the scalar path): one scale per `group` consecutive
// columns of a row (the last group of a row may be shorter), written to scales[r * ld_scale + g].
// The kGroupLanes lanes of a warp share a group: each takes its vectors lane, lane + kGroupLanes, ...
// of the group, keeps up to kCacheVecs of them in registers while the group's amax is reduced over
// the warp (shuffles), then scales and stores them. Vectors never straddle a group boundary: the host
// takes the 16-byte path only where VEC divides the group and the columns.
// kSiluMul as per_token_kernel's: a row of x is [gate | up], `cols` columns each.
constexpr int kGroupLanes = 32;
template <typename T, int VEC, int QD, bool kSiluMul>
__global__ void __launch_bounds__(256) per_group_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q,
                                                        int64_t ldq, float* __restrict__ scales, int64_t ld_scale,
                                                        int64_t rows, int64_t cols, int64_t group,
                                                        const int64_t* __restrict__ gather, int64_t x_rows) {
  enter_dependent_grid();
  const int64_t groups_per_row = qb::cdiv(cols, group);
  const int64_t groups = rows * groups_per_row;
  const int64_t gid = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kGroupLanes;
  const int lane = threadIdx.x % kGroupLanes;
  // A group index past the end still takes part in the shuffles (all lanes of a warp must), with no data.
  const bool live = gid < groups;
  int64_t r = 0;
  if (live) r = groups <= 0xffffffffLL ? int64_t(uint32_t(gid) / uint32_t(groups_per_row)) : gid / groups_per_row;
  const int64_t g = live ? gid - r * groups_per_row : 0;
  const int64_t c0 = g * group;
  const int64_t nvec = live ? (std::min<int64_t>(group, cols - c0) + VEC - 1) / VEC : 0;
  bool bad = false;
  const int64_t src = live ? source_row(gather, r, x_rows, bad) : 0;
  const auto* xg = reinterpret_cast<const Vec<T, VEC>*>(x + src * ldx + c0);
  const int64_t up = cols / VEC;  // where the up half starts, in vectors (kSiluMul only)
  uint8_t* qg = q + r * ldq + c0;

  Vec<T, VEC> cache[kCacheVecs];
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kCacheVecs; ++i) {
    const int64_t idx = lane + int64_t(i) * kGroupLanes;
    if (idx < nvec) {
      cache[i] = load_src<T, VEC, kSiluMul, true>(xg, idx, up);
      m = vec_amax<T, VEC>(cache[i], m);
    }
  }
  for (int64_t idx = lane + int64_t(kCacheVecs) * kGroupLanes; idx < nvec; idx += kGroupLanes)
    m = vec_amax<T, VEC>(load_src<T, VEC, kSiluMul, false>(xg, idx, up), m);
#pragma unroll
  for (int o = kGroupLanes / 2; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (!live) return;

  const float scale = poison_if(bad, scale_from_amax<QD>(m, nullptr));
  if (lane == 0) scales[r * ld_scale + g] = scale;
  const Divisor div = make_divisor(scale, true);
#pragma unroll
  for (int i = 0; i < kCacheVecs; ++i) {
    const int64_t idx = lane + int64_t(i) * kGroupLanes;
    if (idx < nvec) vec_store<T, VEC, QD>(cache[i], div, qg + idx * VEC);
  }
  for (int64_t idx = lane + int64_t(kCacheVecs) * kGroupLanes; idx < nvec; idx += kGroupLanes)
    vec_store<T, VEC, QD>(load_src<T, VEC, kSiluMul, false>(xg, idx, up), div, qg + idx * VEC);
}

// Max over an aligned run of `width` lanes (a power of two up to 32), NaN winning; every lane of the
// warp must take part.
__device__ __forceinline__ float lanes_max(float m, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// per_row_group_kernel's last step for vector idx of a row (idx < nvec), its group's amax m already
// reduced: the scale (written by the group's first lane), then the quantized vector.
template <typename T, int VEC, int QD>
__device__ __forceinline__ void store_group_vec(const Vec<T, VEC>& v, float m, int64_t idx, int group_log2, bool bad,
                                                float* sr, uint8_t* qr) {
  const float scale = poison_if(bad, scale_from_amax<QD>(m, nullptr));
  if ((idx & ((int64_t(1) << group_log2) - 1)) == 0) sr[idx >> group_log2] = scale;
  vec_store<T, VEC, QD>(v, make_divisor(scale, true), qr + idx * VEC);
}

// DYNAMIC_GROUP for groups of 2^group_log2 vectors, at most 32 (bf16 / fp16 groups of 128 columns
// are 16 vectors, of 64 are 8): per_token_kernel's layout, block r owning row r and thread t its
// vectors t, t + blockDim, ..., so that a warp's load reads 32 consecutive vectors (512 bytes) and its
// store writes 32 consecutive outputs. blockDim is a multiple of 32, so the lanes holding one
// group's vectors in one load are an aligned run of a warp: the group's amax is a shuffle reduction
// over that run (no block barrier), and each of a thread's VECS vectors has its own group, scale and
// divisor. Vectors past the register cache (rows over VECS * blockDim vectors) are quantized one
// block-width step at a time; a step holds whole groups, so nothing is read twice.
// kSiluMul as per_token_kernel's.
template <typename T, int VEC, int QD, int VECS, bool kSiluMul>
__global__ void __launch_bounds__(kMaxTokenThreads)
    per_row_group_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq,
                         float* __restrict__ scales, int64_t ld_scale, int64_t nvec, int group_log2,
                         const int64_t* __restrict__ gather, int64_t x_rows) {
  enter_dependent_grid();
  const int64_t r = blockIdx.x;
  bool bad;
  const auto* xr = reinterpret_cast<const Vec<T, VEC>*>(x + source_row(gather, r, x_rows, bad) * ldx);
  uint8_t* qr = q + r * ldq;
  float* sr = scales + r * ld_scale;
  const int width = 1 << group_log2;

  Vec<T, VEC> cache[VECS];
  float m[VECS];
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
    m[i] = 0.0f;
    if (idx < nvec) {
      cache[i] = load_src<T, VEC, kSiluMul, true>(xr, idx, nvec);
      m[i] = vec_amax<T, VEC>(cache[i], 0.0f);
    }
  }
#pragma unroll
  for (int i = 0; i < VECS; ++i) m[i] = lanes_max(m[i], width);
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
    if (idx < nvec) store_group_vec<T, VEC, QD>(cache[i], m[i], idx, group_log2, bad, sr, qr);
  }
  for (int64_t base = int64_t(VECS) * blockDim.x; base < nvec; base += blockDim.x) {  // uniform over the block
    const int64_t idx = base + threadIdx.x;
    Vec<T, VEC> v;
    float mv = 0.0f;
    if (idx < nvec) {
      v = load_src<T, VEC, kSiluMul, true>(xr, idx, nvec);
      mv = vec_amax<T, VEC>(v, 0.0f);
    }
    mv = lanes_max(mv, width);
    if (idx < nvec) store_group_vec<T, VEC, QD>(v, mv, idx, group_log2, bad, sr, qr);
  }
}

// Tuning/tests (qb_quantize_override): -1 automatic, 0 one block per row, 1 persistent pipelined
// (per token), 2 the warp-per-group kernel (per group, where the block-per-row one would run);
// vectors per thread of the block-per-row kernels, 0 automatic.
thread_local int t_token_kernel = -1;
thread_local int t_row_vecs = 0;

// Threads of a block that takes a row of nvec vectors, `vecs` per thread: a multiple of 32, at most
// kMaxTokenThreads (longer rows loop past the register cache).
int64_t token_threads(int64_t nvec, int vecs) {
  return std::min<int64_t>(kMaxTokenThreads, std::max<int64_t>(32, qb::cdiv(qb::cdiv(nvec, vecs), 32) * 32));
}

// 16-byte vectors per thread of the block-per-row kernels (1, 2 or kCacheVecs) for rows of nvec
// vectors: see kFewestVecsBytesPerSm. two_vecs_bytes: below it at most two (kTwoVecsBytesPerSm per
// token, kGroupTwoVecsBytesPerSm per group).
int row_vecs(int64_t rows, int64_t nvec, int sm_count, int64_t two_vecs_bytes = kTwoVecsBytesPerSm) {
  if (t_row_vecs > 0) return t_row_vecs >= kCacheVecs ? kCacheVecs : t_row_vecs >= 2 ? 2 : 1;
  const int64_t bytes_per_sm = rows * nvec * 16 / std::max(sm_count, 1);
  int vecs = bytes_per_sm < kFewestVecsBytesPerSm ? 1 : bytes_per_sm < two_vecs_bytes ? 2 : kCacheVecs;
  while (vecs < kCacheVecs && qb::cdiv(nvec, vecs) > kMaxTokenThreads) vecs *= 2;  // the row must fit one block
  return vecs;
}

// Resident blocks per SM of a kernel at `threads` threads, cached per (kernel, device, threads).
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, int device) {
  static thread_local int cached_device = -1, cached_threads = -1, cached_blocks = 1;
  if (device != cached_device || threads != cached_threads) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, 0) != cudaSuccess || b < 1) {
      (void)cudaGetLastError();
      b = 1;
    }
    cached_device = device;
    cached_threads = threads;
    cached_blocks = b;
  }
  return cached_blocks;
}

// STATIC_TENSOR and the convert pass of DYNAMIC_TENSOR, grid-stride over rows * nvec vectors.
// The scale is read from `scale` (static) or derived from the amax accumulator (dynamic); in the
// latter case thread 0 of block 0 also writes it out when `scale_out` is given.
template <typename T, int VEC, int QD, bool kDynamic>
__global__ void __launch_bounds__(256) elementwise_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q,
                                                          int64_t ldq, int64_t rows, int64_t nvec,
                                                          const float* __restrict__ scale_in,
                                                          const unsigned* __restrict__ amax_bits,
                                                          const float* __restrict__ scale_ub, float* scale_out) {
  enter_dependent_grid();
  float scale;
  if constexpr (kDynamic) {
    scale = scale_from_amax<QD>(__uint_as_float(*amax_bits), scale_ub);
    if (scale_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  } else {
    scale = checked_static_scale(*scale_in);
  }
  const Divisor div = make_divisor(scale, kDynamic && scale_ub == nullptr);
  const int64_t total = rows * nvec;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / nvec, c = i - r * nvec;
    const auto v = *reinterpret_cast<const Vec<T, VEC>*>(x + r * ldx + c * VEC);
    vec_store<T, VEC, QD>(v, div, q + r * ldq + c * VEC);
  }
}

// DYNAMIC_TENSOR amax pass: non-negative floats (and NaNs with the sign bit clear) order like
// their bit patterns, so an unsigned atomicMax on the bits is a float max in which NaN wins.
template <typename T, int VEC>
__global__ void __launch_bounds__(256) amax_kernel(const T* __restrict__ x, int64_t ldx, int64_t rows, int64_t nvec,
                                                   unsigned* amax_bits) {
  __shared__ float red[32];
  float m = 0.0f;
  const int64_t total = rows * nvec;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / nvec, c = i - r * nvec;
    m = vec_amax<T, VEC>(*reinterpret_cast<const Vec<T, VEC>*>(x + r * ldx + c * VEC), m);
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// Without a workspace the amax accumulates in `scale` itself; this turns it into the scale.
template <int QD>
__global__ void finalize_scale_kernel(float* scale, const float* scale_ub) {
  *scale = scale_from_amax<QD>(*scale, scale_ub);
}

struct QuantArgs {
  const void* x;
  int64_t ldx;
  uint8_t* q;
  int64_t ldq;
  float* scale;
  int64_t rows, cols;
  int mode;
  int64_t group, ld_scale;  // DYNAMIC_GROUP only
  const int64_t* gather;    // DYNAMIC_TOKEN and DYNAMIC_GROUP: row r of q from row gather[r] of x, or r
  int64_t x_rows;           // the rows of x that gather may name
  bool silu_mul;            // DYNAMIC_TOKEN and DYNAMIC_GROUP: x's rows are [gate | up], 2 * cols wide
  const float* scale_ub;
  void* workspace;
  cudaStream_t stream;
  int sm_count;
  int device;
  bool programmatic;  // launch the single-kernel modes as programmatic dependents
};

// <<<grid, block, 0, stream>>>, as a programmatic dependent of the previous kernel when asked.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), unsigned grid, int block, const QuantArgs& a, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = a.stream;
  cfg.attrs = attr;
  cfg.numAttrs = a.programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

template <typename T, int VEC, int QD, bool kSiluMul>
int launch(const QuantArgs& a, const qb::Err& err) {
  const int64_t nvec = a.cols / VEC;
  const T* x = static_cast<const T*>(a.x);
  const int64_t total = a.rows * nvec;
  // Enough resident blocks to cover the GPU several times over; grid-stride does the rest.
  const int64_t grid_cap = int64_t(a.sm_count) * 16;
  const int threads = 256;
  const unsigned grid_ew = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(qb::cdiv(total, threads), grid_cap)));

  if (a.mode == QB_QUANT_DYNAMIC_GROUP) {
    // Groups of a power-of-two number of vectors up to 32 (the 16-byte path at the usual group sizes):
    // one block per row, its vectors per thread chosen as the per-token kernel's.
    const int64_t group_vecs = a.group / VEC;
    cudaError_t e = cudaSuccess;
    bool by_row = false;
    if constexpr (VEC > 1) {
      by_row = group_vecs <= 32 && (group_vecs & (group_vecs - 1)) == 0 && a.rows <= 0x7fffffffLL &&
               t_token_kernel != 2;
      if (by_row) {
        const int vecs = row_vecs(a.rows, nvec, a.sm_count, kGroupTwoVecsBytesPerSm);
        auto kernel = per_row_group_kernel<T, VEC, QD, kCacheVecs, kSiluMul>;
        if (vecs == 1) kernel = per_row_group_kernel<T, VEC, QD, 1, kSiluMul>;
        if (vecs == 2) kernel = per_row_group_kernel<T, VEC, QD, 2, kSiluMul>;
        const int group_log2 = __builtin_ctzll(static_cast<unsigned long long>(group_vecs));
        e = launch_kernel(kernel, static_cast<unsigned>(a.rows), static_cast<int>(token_threads(nvec, vecs)), a, x,
                          a.ldx, a.q, a.ldq, a.scale, a.ld_scale, nvec, group_log2, a.gather, a.x_rows);
      }
    }
    if (!by_row) {  // otherwise a warp per group
      const int64_t groups = a.rows * qb::cdiv(a.cols, a.group);
      const unsigned grid = static_cast<unsigned>(qb::cdiv(groups * kGroupLanes, int64_t(threads)));
      e = launch_kernel(per_group_kernel<T, VEC, QD, kSiluMul>, grid, threads, a, x, a.ldx, a.q, a.ldq, a.scale,
                        a.ld_scale, a.rows, a.cols, a.group, a.gather, a.x_rows);
    }
    if (e != cudaSuccess)
      return err.cuda(e, kSiluMul ? "qb_quantize_silu_mul: kernel launch" : "qb_quantize_group: kernel launch");
  } else if (a.mode == QB_QUANT_DYNAMIC_TOKEN) {
    // one, two or four vectors per thread on the 16-byte path; the scalar path (odd shapes) keeps four
    const int vecs = VEC > 1 ? row_vecs(a.rows, nvec, a.sm_count) : kCacheVecs;
    const int t = static_cast<int>(token_threads(nvec, vecs));
    // the row-pipelined kernel caches kCacheVecs vectors per thread
    const int t_pipelined = static_cast<int>(token_threads(nvec, kCacheVecs));
    const bool fits = t_pipelined <= kMaxPipelinedThreads;
    // Measured on the H200 (bench_quantize.py): the row-pipelined kernel was no faster at 8192 x
    // 14336 and 19 % slower at 8192 x 4096 (39.3 vs 33.1 us) than one block per row, so it runs
    // only when forced (kept for tuning on other GPUs).
    const bool pipelined = fits && t_token_kernel == 1 && a.gather == nullptr && !kSiluMul;
    if (pipelined) {
      const int64_t resident =
          int64_t(a.sm_count) * resident_blocks(per_token_pipelined_kernel<T, VEC, QD>, t_pipelined, a.device);
      per_token_pipelined_kernel<T, VEC, QD><<<static_cast<unsigned>(std::min<int64_t>(a.rows, resident)), t_pipelined,
                                               0, a.stream>>>(x, a.ldx, a.q, a.ldq, a.scale, a.rows, nvec, a.scale_ub);
    } else {
      auto kernel = per_token_kernel<T, VEC, QD, kCacheVecs, kSiluMul>;
      if constexpr (VEC > 1) {
        if (vecs == 1) kernel = per_token_kernel<T, VEC, QD, 1, kSiluMul>;
        if (vecs == 2) kernel = per_token_kernel<T, VEC, QD, 2, kSiluMul>;
      }
      cudaError_t e = launch_kernel(kernel, static_cast<unsigned>(a.rows), t, a, x, a.ldx, a.q, a.ldq, a.scale, nvec,
                                    a.scale_ub, a.gather, a.x_rows);
      if (e != cudaSuccess)
        return err.cuda(e, kSiluMul ? "qb_quantize_silu_mul: kernel launch" : "qb_quantize: kernel launch");
    }
  } else if (a.mode == QB_QUANT_STATIC_TENSOR) {
    cudaError_t e = launch_kernel(elementwise_kernel<T, VEC, QD, false>, grid_ew, threads, a, x, a.ldx, a.q, a.ldq,
                                  a.rows, nvec, a.scale, nullptr, nullptr, nullptr);
    if (e != cudaSuccess) return err.cuda(e, "qb_quantize: kernel launch");
  } else {
    unsigned* acc = static_cast<unsigned*>(a.workspace ? a.workspace : static_cast<void*>(a.scale));
    cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(unsigned), a.stream);
    if (e != cudaSuccess) return err.cuda(e, "qb_quantize: cudaMemsetAsync");
    amax_kernel<T, VEC><<<grid_ew, threads, 0, a.stream>>>(x, a.ldx, a.rows, nvec, acc);
    elementwise_kernel<T, VEC, QD, true><<<grid_ew, threads, 0, a.stream>>>(
        x, a.ldx, a.q, a.ldq, a.rows, nvec, nullptr, acc, a.scale_ub, a.workspace ? a.scale : nullptr);
    if (!a.workspace) finalize_scale_kernel<QD><<<1, 1, 0, a.stream>>>(a.scale, a.scale_ub);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return err.cuda(e, "qb_quantize: kernel launch");
  return QB_OK;
}

// 16-byte path when every row start of x is 16-byte aligned and every row start of q is aligned
// to the VEC output bytes; the scalar path otherwise.
template <typename T, int QD>
int dispatch_vec(const QuantArgs& a, const qb::Err& err) {
  constexpr int VEC = 16 / sizeof(T);
  const bool vec_ok = qb::aligned16(a.x) && (a.ldx * int64_t(sizeof(T))) % 16 == 0 && a.cols % VEC == 0 &&
                      (reinterpret_cast<uintptr_t>(a.q) % VEC) == 0 && a.ldq % VEC == 0 &&
                      (a.mode != QB_QUANT_DYNAMIC_GROUP || a.group % VEC == 0);
  // The gated activation is built for 16-bit inputs only (the output of a 16-bit GEMM) and for the
  // per-token and per-token-group modes; the entry point passes nothing else.
  if (a.silu_mul) {
    if (std::is_same_v<T, float> || (a.mode != QB_QUANT_DYNAMIC_TOKEN && a.mode != QB_QUANT_DYNAMIC_GROUP))
      return err.set(QB_ERR_UNSUPPORTED, "qb_quantize_silu_mul: 16-bit x, per-token or per-group mode only");
    if constexpr (!std::is_same_v<T, float>)
      return vec_ok ? launch<T, VEC, QD, true>(a, err) : launch<T, 1, QD, true>(a, err);
  }
  return vec_ok ? launch<T, VEC, QD, false>(a, err) : launch<T, 1, QD, false>(a, err);
}

template <typename T>
int dispatch_q(int q_dtype, const QuantArgs& a, const qb::Err& err) {
  switch (q_dtype) {
    case QB_E4M3: return dispatch_vec<T, QB_E4M3>(a, err);
    case QB_E5M2: return dispatch_vec<T, QB_E5M2>(a, err);
    default: return dispatch_vec<T, QB_I8>(a, err);
  }
}

// The checks and the dispatch that qb_quantize and qb_quantize_group share; `fn` names the entry point
// in messages. a.mode is already known to be valid.
int checked_quantize(QuantArgs a, int x_dtype, int q_dtype, const char* fn, const qb::Err& err) {
  if (x_dtype != QB_F32 && x_dtype != QB_F16 && x_dtype != QB_BF16)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x_dtype %d must be f32 (0), f16 (1) or bf16 (2)", fn, x_dtype);
  if (q_dtype != QB_E4M3 && q_dtype != QB_E5M2 && q_dtype != QB_I8)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: q_dtype %d must be e4m3 (3), e5m2 (4) or i8 (5)", fn, q_dtype);
  if (a.rows < 0 || a.cols <= 0)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: rows (=%lld) must be >= 0 and cols (=%lld) > 0", fn,
                   (long long)a.rows, (long long)a.cols);
  if (a.mode == QB_QUANT_DYNAMIC_TOKEN && a.rows > 0x7fffffffLL)
    return err.set(QB_ERR_UNSUPPORTED, "%s: per-token mode takes at most 2^31 - 1 rows", fn);
  if (a.rows == 0) return QB_OK;
  if (a.x == nullptr || a.q == nullptr || a.scale == nullptr)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x, q and scale must be non-NULL", fn);
  if (a.ldx < a.cols || a.ldq < a.cols)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: ldx (=%lld) and ldq (=%lld) must be >= cols (=%lld)", fn,
                   (long long)a.ldx, (long long)a.ldq, (long long)a.cols);
  const size_t xsize = x_dtype == QB_F32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(a.x) % xsize != 0)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x must be aligned to its element size (%zu bytes)", fn, xsize);
  if ((reinterpret_cast<uintptr_t>(a.scale) & 3u) || (a.scale_ub && (reinterpret_cast<uintptr_t>(a.scale_ub) & 3u)))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: scale and scale_ub must be 4-byte aligned fp32", fn);
  if (a.workspace && (reinterpret_cast<uintptr_t>(a.workspace) & 3u))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: workspace must be 4-byte aligned", fn);

  qb::DeviceInfo dev;
  int st = qb::current_device(&dev, err);
  if (st != QB_OK) return st;
  a.sm_count = dev.sm_count;
  a.device = dev.device;
#ifdef QB_BUILT_SM90A
  // Only the sm_90a machine code waits for the previous kernel (griddepcontrol), and the driver runs
  // it on compute capability 9.0 alone: anywhere else these kernels come from older PTX and must not
  // be launched early.
  a.programmatic = dev.cc == 90 && qb::programmatic_launch();
#endif
  switch (x_dtype) {
    case QB_F32: return dispatch_q<float>(q_dtype, a, err);
    case QB_F16: return dispatch_q<__half>(q_dtype, a, err);
    default: return dispatch_q<__nv_bfloat16>(q_dtype, a, err);
  }
}

}  // namespace

extern "C" void qb_quantize_override(int token_kernel, int row_vecs) {
  t_token_kernel = token_kernel;
  t_row_vecs = row_vecs;
}

extern "C" size_t qb_quantize_workspace_size(int64_t rows, int64_t cols, int mode) {
  (void)rows;
  (void)cols;
  return mode == QB_QUANT_DYNAMIC_TENSOR ? 16 : 0;  // one fp32 amax, padded to an aligned 16 bytes
}

extern "C" int qb_quantize(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t rows, int64_t cols,
                           int x_dtype, int q_dtype, int mode, const float* scale_ub, void* workspace, void* stream,
                           char* err_buf, size_t err_len) {
  const qb::Err err{err_buf, err_len};
  if (err_buf && err_len) err_buf[0] = '\0';
  if (mode != QB_QUANT_STATIC_TENSOR && mode != QB_QUANT_DYNAMIC_TENSOR && mode != QB_QUANT_DYNAMIC_TOKEN)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_quantize: mode %d must be 0 (static tensor), 1 (dynamic tensor) or 2 "
                   "(dynamic token); per-group quantize is qb_quantize_group", mode);
  QuantArgs a{x, ldx, static_cast<uint8_t*>(q), ldq, scale, rows, cols, mode, 0, 0, nullptr, rows, false,
              mode == QB_QUANT_STATIC_TENSOR ? nullptr : scale_ub,
              mode == QB_QUANT_DYNAMIC_TENSOR ? workspace : nullptr, static_cast<cudaStream_t>(stream), 0, 0, false};
  return checked_quantize(a, x_dtype, q_dtype, "qb_quantize", err);
}

extern "C" int qb_quantize_group(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t ld_scale,
                                 int64_t rows, int64_t cols, int64_t group, int x_dtype, int q_dtype, void* stream,
                                 char* err_buf, size_t err_len) {
  const qb::Err err{err_buf, err_len};
  if (err_buf && err_len) err_buf[0] = '\0';
  if (group <= 0 || group > (int64_t(1) << 30))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_quantize_group: group (=%lld) must be in [1, 2^30]", (long long)group);
  if (cols > 0 && ld_scale < qb::cdiv(cols, group))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_quantize_group: ld_scale (=%lld) must be >= ceil(cols / group) (=%lld)",
                   (long long)ld_scale, (long long)qb::cdiv(cols, group));
  // The grid holds one thread per lane of every group: keep its block count within CUDA's 2^31 - 1.
  if (cols > 0 && rows > 0 && rows > (int64_t(1) << 36) / qb::cdiv(cols, group))
    return err.set(QB_ERR_UNSUPPORTED, "qb_quantize_group: at most 2^36 groups (rows x ceil(cols / group))");
  QuantArgs a{x, ldx, static_cast<uint8_t*>(q), ldq, scale, rows, cols, QB_QUANT_DYNAMIC_GROUP, group, ld_scale,
              nullptr, rows, false, nullptr, nullptr, static_cast<cudaStream_t>(stream), 0, 0, false};
  return checked_quantize(a, x_dtype, q_dtype, "qb_quantize_group", err);
}

extern "C" int qb_quantize_gather(const void* x, int64_t ldx, int64_t x_rows, const int64_t* index, void* q,
                                  int64_t ldq, float* scale, int64_t ld_scale, int64_t rows, int64_t cols,
                                  int64_t group, int x_dtype, int q_dtype, void* stream, char* err_buf,
                                  size_t err_len) {
  const qb::Err err{err_buf, err_len};
  if (err_buf && err_len) err_buf[0] = '\0';
  const char* fn = "qb_quantize_gather";
  if (group < 0 || group > (int64_t(1) << 30))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: group (=%lld) must be 0 (per token) or in [1, 2^30]", fn,
                   (long long)group);
  if (group > 0 && cols > 0 && ld_scale < qb::cdiv(cols, group))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: ld_scale (=%lld) must be >= ceil(cols / group) (=%lld)", fn,
                   (long long)ld_scale, (long long)qb::cdiv(cols, group));
  if (group > 0 && cols > 0 && rows > 0 && rows > (int64_t(1) << 36) / qb::cdiv(cols, group))
    return err.set(QB_ERR_UNSUPPORTED, "%s: at most 2^36 groups (rows x ceil(cols / group))", fn);
  if (rows > 0 && (index == nullptr || (reinterpret_cast<uintptr_t>(index) & 7u)))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: index must be a non-NULL, 8-byte aligned int64 array", fn);
  if (rows > 0 && x_rows < 1)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x_rows (=%lld) must be >= 1 when rows > 0", fn, (long long)x_rows);
  QuantArgs a{x, ldx, static_cast<uint8_t*>(q), ldq, scale, rows, cols,
              group > 0 ? QB_QUANT_DYNAMIC_GROUP : QB_QUANT_DYNAMIC_TOKEN, group, ld_scale, index, x_rows, false,
              nullptr, nullptr, static_cast<cudaStream_t>(stream), 0, 0, false};
  return checked_quantize(a, x_dtype, q_dtype, fn, err);
}

extern "C" int qb_quantize_silu_mul(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t ld_scale,
                                    int64_t rows, int64_t cols, int64_t group, int x_dtype, int q_dtype, void* stream,
                                    char* err_buf, size_t err_len) {
  const qb::Err err{err_buf, err_len};
  if (err_buf && err_len) err_buf[0] = '\0';
  const char* fn = "qb_quantize_silu_mul";
  if (x_dtype != QB_F16 && x_dtype != QB_BF16)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x_dtype %d must be f16 (1) or bf16 (2)", fn, x_dtype);
  if (group < 0 || group > (int64_t(1) << 30))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: group (=%lld) must be 0 (per token) or in [1, 2^30]", fn,
                   (long long)group);
  if (cols > (int64_t(1) << 40))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: cols (=%lld) must be at most 2^40", fn, (long long)cols);
  if (cols > 0 && ldx < 2 * cols)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: ldx (=%lld) must be >= 2 * cols (=%lld): a row of x is [gate | up]",
                   fn, (long long)ldx, (long long)(2 * cols));
  if (group > 0 && cols > 0 && ld_scale < qb::cdiv(cols, group))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: ld_scale (=%lld) must be >= ceil(cols / group) (=%lld)", fn,
                   (long long)ld_scale, (long long)qb::cdiv(cols, group));
  if (group > 0 && cols > 0 && rows > 0 && rows > (int64_t(1) << 36) / qb::cdiv(cols, group))
    return err.set(QB_ERR_UNSUPPORTED, "%s: at most 2^36 groups (rows x ceil(cols / group))", fn);
  QuantArgs a{x, ldx, static_cast<uint8_t*>(q), ldq, scale, rows, cols,
              group > 0 ? QB_QUANT_DYNAMIC_GROUP : QB_QUANT_DYNAMIC_TOKEN, group, ld_scale, nullptr, rows, true,
              nullptr, nullptr, static_cast<cudaStream_t>(stream), 0, 0, false};
  return checked_quantize(a, x_dtype, q_dtype, fn, err);
}
