// quantize_kernels.h: the quantize kernels (wave64), one template per mode.
//
// Layout: x[r * ldx + c], q[r * ldq + c]. Rows whose pointers and strides allow it are moved in
// 16-byte loads (VEC elements per vector); anything else takes the same kernels with VEC = 1.
// Every loop that contains a barrier or a shuffle runs the same number of times in every thread of
// a block: HIP-CPU implements both as a block-wide barrier, and on the GPU a shuffle needs its
// partner lanes active.
//
// The quantized format is a run-time argument of each kernel (qd, the same for the whole grid): the
// kernel switches once, at its top, to a body compiled for that format. Each body is then compiled
// as if it were a kernel of its own (no value lives across the switch, so the registers are those of
// one format), while there is one kernel per input type and vector width: a fifth of the
// instantiations, which is what the HIP-CPU build of the tests spends its compile time on.
//
// Grids stay within kMaxGrid blocks and loop over the rest: AMD's dispatch counts the grid in
// work-items as a 32-bit number, so one block per row or group would fail on very large inputs.
#pragma once

#include <stdint.h>

#include "quantize_numerics.h"

namespace qbr {

constexpr int kMaxThreads = 1024;   // per-token blocks: up to 16 waves
constexpr int kThreads = 256;       // every other kernel: 4 waves
constexpr int kCacheVecs = 4;       // 16-byte vectors a thread keeps in registers between amax and store
// Blocks per launch; grid-stride loops cover the rest. The tests' HIP-CPU build sets it to a few blocks
// so that every grid-stride loop runs many times on small inputs.
#ifndef QB_ROCM_MAX_GRID
#define QB_ROCM_MAX_GRID 65536
#endif
constexpr int64_t kMaxGrid = QB_ROCM_MAX_GRID;
constexpr int kTileVecs = 4;        // vectors per thread in one tile of the elementwise and amax passes

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <int VEC>
struct alignas(VEC) QVec {
  uint8_t v[VEC];
};

// The fp32 bits of max |x| over a vector (NaN winning; see magnitude()).
template <typename T, int VEC>
QB_DEV uint32_t vec_amax(const Vec<T, VEC>& x) {
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < VEC; ++j) m = umax(m, magnitude(x.v[j]));
  return magnitude_to_f32_bits(T{}, m);
}

template <typename T, int VEC, int QD>
QB_DEV void vec_store(const Vec<T, VEC>& x, float scale, uint8_t* dst) {
  QVec<VEC> q;
#pragma unroll
  for (int j = 0; j < VEC; ++j) q.v[j] = encode<QD>(to_f32(x.v[j]) / scale);
  *reinterpret_cast<QVec<VEC>*>(dst) = q;
}

// Max of `m` over groups of `width` lanes (a power of two up to 64) of a wavefront.
QB_DEV uint32_t lanes_max(uint32_t m, int width) {
  for (int o = width / 2; o > 0; o >>= 1) m = umax(m, __shfl_xor(m, o, width));
  return m;
}

// Max over the block, as a float; every thread gets it. blockDim.x is a multiple of kWave; `red`
// holds one value per wavefront. The second barrier lets the caller reuse `red` right away.
QB_DEV float block_max(uint32_t m, uint32_t* red) {
  m = lanes_max(m, kWave);
  const int wave = threadIdx.x / kWave, lane = threadIdx.x % kWave;
  if (lane == 0) red[wave] = m;
  __syncthreads();
  const int waves = blockDim.x / kWave;
  m = lanes_max(lane < waves ? red[lane] : 0u, kWave);
  __syncthreads();
  return float_of(m);
}

// DYNAMIC_TOKEN: a block quantizes rows blockIdx.x, blockIdx.x + gridDim.x, ... of nvec vectors.
// Each thread keeps up to kCacheVecs of a row's vectors in registers while the row's amax is
// reduced, so rows of up to kCacheVecs * blockDim.x vectors are read once; longer ones are read
// again for the store.
template <typename T, int VEC, int QD>
QB_DEV void per_token(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq,
                      float* __restrict__ scales, int64_t rows, int64_t nvec, const float* __restrict__ scale_ub,
                      uint32_t* red) {
  using V = Vec<T, VEC>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const V* xr = reinterpret_cast<const V*>(x + r * ldx);
    uint8_t* qr = q + r * ldq;
    V cache[kCacheVecs];
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) {
      const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
      if (idx < nvec) {
        cache[i] = xr[idx];
        m = umax(m, vec_amax<T, VEC>(cache[i]));
      }
    }
    for (int64_t idx = threadIdx.x + int64_t(kCacheVecs) * blockDim.x; idx < nvec; idx += blockDim.x)
      m = umax(m, vec_amax<T, VEC>(xr[idx]));

    const float scale = dynamic_scale<QD>(block_max(m, red), scale_ub);
    if (threadIdx.x == 0) scales[r] = scale;
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) {
      const int64_t idx = threadIdx.x + int64_t(i) * blockDim.x;
      if (idx < nvec) vec_store<T, VEC, QD>(cache[i], scale, qr + idx * VEC);
    }
    for (int64_t idx = threadIdx.x + int64_t(kCacheVecs) * blockDim.x; idx < nvec; idx += blockDim.x)
      vec_store<T, VEC, QD>(xr[idx], scale, qr + idx * VEC);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads)
    per_token_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq,
                     float* __restrict__ scales, int64_t rows, int64_t nvec, const float* __restrict__ scale_ub,
                     int qd) {
  __shared__ uint32_t red[kMaxThreads / kWave];
  // Through a pointer: g++ takes HIP-CPU's __shared__ (thread_local) array used only inside the lambda
  // for an unused variable.
  uint32_t* const scratch = red;
  with_format(qd, [&](auto format) {
    per_token<T, VEC, decltype(format)::value>(x, ldx, q, ldq, scales, rows, nvec, scale_ub, scratch);
  });
}

// DYNAMIC_GROUP: one scale per `group` consecutive columns of a row (the last group of a row may be
// shorter), written to scales[r * ld_scale + g]. `lanes` lanes of a wavefront (a power of two, 4 to
// 64) share a group: each takes vectors lane, lane + lanes, ... of it, keeps up to kCacheVecs of them
// in registers while the group's amax is reduced over those lanes, then scales and stores them.
// Vectors never straddle groups: the host takes the 16-byte path only where VEC divides the group.
template <typename T, int VEC, int QD>
QB_DEV void per_group(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq,
                      float* __restrict__ scales, int64_t ld_scale, int64_t rows, int64_t cols, int64_t group,
                      int lanes) {
  using V = Vec<T, VEC>;
  const int64_t groups_per_row = (cols + group - 1) / group;
  const int64_t groups = rows * groups_per_row;
  const int64_t per_block = kThreads / lanes;
  const int lane = threadIdx.x % lanes;
  for (int64_t first = blockIdx.x * per_block; first < groups; first += int64_t(gridDim.x) * per_block) {
    const int64_t gid = first + threadIdx.x / lanes;
    // A group past the end still takes part in the shuffles, with no data.
    const bool live = gid < groups;
    // 32-bit division where the group count allows: a 64-bit one is a long instruction sequence.
    const int64_t r = !live ? 0 : groups <= 0xffffffffLL ? int64_t(uint32_t(gid) / uint32_t(groups_per_row))
                                                          : gid / groups_per_row;
    const int64_t g = live ? gid - r * groups_per_row : 0;
    const int64_t c0 = g * group;
    const int64_t len = live ? (group < cols - c0 ? group : cols - c0) : 0;
    const int64_t nvec = (len + VEC - 1) / VEC;
    const V* xg = reinterpret_cast<const V*>(x + r * ldx + c0);
    uint8_t* qg = q + r * ldq + c0;

    V cache[kCacheVecs];
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) {
      const int64_t idx = lane + int64_t(i) * lanes;
      if (idx < nvec) {
        cache[i] = xg[idx];
        m = umax(m, vec_amax<T, VEC>(cache[i]));
      }
    }
    for (int64_t idx = lane + int64_t(kCacheVecs) * lanes; idx < nvec; idx += lanes)
      m = umax(m, vec_amax<T, VEC>(xg[idx]));
    m = lanes_max(m, lanes);
    if (!live) continue;

    const float scale = dynamic_scale<QD>(float_of(m), nullptr);
    if (lane == 0) scales[r * ld_scale + g] = scale;
#pragma unroll
    for (int i = 0; i < kCacheVecs; ++i) {
      const int64_t idx = lane + int64_t(i) * lanes;
      if (idx < nvec) vec_store<T, VEC, QD>(cache[i], scale, qg + idx * VEC);
    }
    for (int64_t idx = lane + int64_t(kCacheVecs) * lanes; idx < nvec; idx += lanes)
      vec_store<T, VEC, QD>(xg[idx], scale, qg + idx * VEC);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    per_group_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq,
                     float* __restrict__ scales, int64_t ld_scale, int64_t rows, int64_t cols, int64_t group,
                     int lanes, int qd) {
  with_format(qd, [&](auto format) {
    per_group<T, VEC, decltype(format)::value>(x, ldx, q, ldq, scales, ld_scale, rows, cols, group, lanes);
  });
}

// The elementwise and amax passes walk tiles of kThreads * kTileVecs vectors of one row, so that a
// row index costs one division per tile, not per vector. `visit` runs on every vector of x.
template <typename T, int VEC, typename Visit>
QB_DEV void for_each_vector(const T* x, int64_t ldx, int64_t rows, int64_t nvec, Visit visit) {
  const int64_t tile_vecs = int64_t(kThreads) * kTileVecs;
  const int64_t tiles_per_row = (nvec + tile_vecs - 1) / tile_vecs;
  for (int64_t t = blockIdx.x; t < rows * tiles_per_row; t += gridDim.x) {
    const int64_t r = t / tiles_per_row;
    const int64_t c0 = (t - r * tiles_per_row) * tile_vecs;
    const auto* xr = reinterpret_cast<const Vec<T, VEC>*>(x + r * ldx);
#pragma unroll
    for (int i = 0; i < kTileVecs; ++i) {
      const int64_t c = c0 + threadIdx.x + int64_t(i) * kThreads;
      if (c < nvec) visit(r, c, xr[c]);
    }
  }
}

// STATIC_TENSOR (scale read from scale_in) and the convert pass of DYNAMIC_TENSOR (scale derived from
// the amax accumulator; block 0's thread 0 also writes it to scale_out when given).
template <typename T, int VEC, int QD>
QB_DEV void elementwise(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq, int64_t rows,
                        int64_t nvec, const float* __restrict__ scale_in, const uint32_t* __restrict__ amax_bits,
                        const float* __restrict__ scale_ub, float* scale_out) {
  float scale;
  if (amax_bits != nullptr) {
    scale = dynamic_scale<QD>(float_of(*amax_bits), scale_ub);
    if (scale_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  } else {
    scale = checked_scale(*scale_in);
  }
  for_each_vector<T, VEC>(x, ldx, rows, nvec, [&](int64_t r, int64_t c, const Vec<T, VEC>& v) {
    vec_store<T, VEC, QD>(v, scale, q + r * ldq + c * VEC);
  });
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q, int64_t ldq, int64_t rows,
                       int64_t nvec, const float* __restrict__ scale_in, const uint32_t* __restrict__ amax_bits,
                       const float* __restrict__ scale_ub, float* scale_out, int qd) {
  with_format(qd, [&](auto format) {
    elementwise<T, VEC, decltype(format)::value>(x, ldx, q, ldq, rows, nvec, scale_in, amax_bits, scale_ub,
                                                 scale_out);
  });
}

// DYNAMIC_TENSOR amax pass: the bits of non-negative floats order like the floats (NaN above +inf),
// so an unsigned atomicMax on them is a float max in which NaN wins.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ x, int64_t ldx, int64_t rows, int64_t nvec, uint32_t* amax_bits) {
  __shared__ uint32_t red[kThreads / kWave];
  uint32_t m = 0;
  for_each_vector<T, VEC>(x, ldx, rows, nvec,
                          [&](int64_t, int64_t, const Vec<T, VEC>& v) { m = umax(m, vec_amax<T, VEC>(v)); });
  m = bits_of(block_max(m, red));
  if (threadIdx.x == 0) atomicMax(amax_bits, m);
}

// Without a workspace the amax accumulates in `scale` itself; this turns it into the scale.
__global__ void finalize_scale_kernel(float* scale, const float* scale_ub, int qd) {
  with_format(qd, [&](auto format) { *scale = dynamic_scale<decltype(format)::value>(*scale, scale_ub); });
}

}  // namespace qbr
