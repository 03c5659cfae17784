// quantize_numerics.h: one element's arithmetic, exactly as the reference provider does it.
//
// Everything here is integer and IEEE fp32 arithmetic that means the same on an AMD GPU and on a CPU
// (the HIP-CPU runtime the tests run this source under): fp16/bf16 decoding, |x| maxima, the dynamic
// scale and the fp8/int8 encoders. No conversion instruction of the hardware is used: gfx942's
// v_cvt_pk_fp8_f32 writes fnuz, gfx950's OCP, and their NaN and saturation rules differ from the
// reference's, so a software encoder is what makes one result on every target and lets the CPU
// check it bit for bit.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "qbackend_rocm.h"
#include "rocm_compat.h"

namespace qbr {

QB_DEV uint32_t bits_of(float f) { return __builtin_bit_cast(uint32_t, f); }
QB_DEV float float_of(uint32_t u) { return __builtin_bit_cast(float, u); }

// Input element types. 16-bit inputs are kept as their bits: the CPU runtime has no bfloat16 type,
// and decoding by hand is exact.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

// Branch-free (selects, not jumps): eight of these run unrolled per 16-byte vector, and divergent
// branches there would cost exec-mask registers on the GPU.
QB_DEV float f16_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
  const uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13);  // inf, or NaN with its payload
  const uint32_t normal = (em + (112u << 10)) << 13;             // rebias the exponent from 15 to 127
  const uint32_t subnormal = bits_of(float(em) * 0x1p-24f);      // em units of 2^-24, exact in fp32
  const uint32_t mag = em >= 0x7c00u ? special : em >= 0x0400u ? normal : subnormal;
  return float_of(mag | sign);
}

QB_DEV float to_f32(float v) { return v; }
QB_DEV float to_f32(Bf16 v) { return float_of(uint32_t(v.bits) << 16); }
QB_DEV float to_f32(F16 v) { return f16_to_f32(v.bits); }

// |x| as the bits of its fp32 value. Non-negative floats, and NaNs with the sign bit clear, order
// like their bit patterns, every NaN above +inf: so an unsigned max over these bits is a float max
// in which NaN wins, as torch's amax does. For 16-bit inputs the max is taken over the 16-bit
// magnitudes (the same order) and decoded once.
QB_DEV uint32_t magnitude(float v) { return bits_of(v) & 0x7fffffffu; }
QB_DEV uint32_t magnitude(Bf16 v) { return v.bits & 0x7fffu; }
QB_DEV uint32_t magnitude(F16 v) { return v.bits & 0x7fffu; }
QB_DEV uint32_t magnitude_to_f32_bits(float, uint32_t m) { return m; }
QB_DEV uint32_t magnitude_to_f32_bits(Bf16, uint32_t m) { return m << 16; }
QB_DEV uint32_t magnitude_to_f32_bits(F16, uint32_t m) { return bits_of(f16_to_f32(m)); }

QB_DEV uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// The quantized formats. fp8: mantissa bits, exponent bias, largest finite value, NaN byte, and
// whether the format lacks -0 (fnuz: 0x80 is its only NaN).
template <int QD>
struct Format;
template <>
struct Format<QB_E4M3> {
  static constexpr int mant = 3, bias = 7;
  static constexpr float qmax = 448.0f;
  static constexpr uint8_t nan = 0x7f;
  static constexpr bool fnuz = false;
};
template <>
struct Format<QB_E5M2> {
  static constexpr int mant = 2, bias = 15;
  static constexpr float qmax = 57344.0f;
  static constexpr uint8_t nan = 0x7f;
  static constexpr bool fnuz = false;
};
template <>
struct Format<QB_E4M3FNUZ> {
  static constexpr int mant = 3, bias = 8;
  static constexpr float qmax = 240.0f;
  static constexpr uint8_t nan = 0x80;
  static constexpr bool fnuz = true;
};
template <>
struct Format<QB_E5M2FNUZ> {
  static constexpr int mant = 2, bias = 16;
  static constexpr float qmax = 57344.0f;
  static constexpr uint8_t nan = 0x80;
  static constexpr bool fnuz = true;
};
template <>
struct Format<QB_I8> {
  static constexpr float qmax = 127.0f;
};

// Calls f(std::integral_constant<int, QD>) for the format code qd: the kernels take the quantized
// format as a run-time argument (the same across the grid, so the branch is uniform) and instantiate
// only the part of their body that depends on it, once per format.
template <typename F>
QB_DEV void with_format(int qd, F&& f) {
  switch (qd) {
    case QB_E4M3: f(std::integral_constant<int, QB_E4M3>{}); break;
    case QB_E5M2: f(std::integral_constant<int, QB_E5M2>{}); break;
    case QB_E4M3FNUZ: f(std::integral_constant<int, QB_E4M3FNUZ>{}); break;
    case QB_E5M2FNUZ: f(std::integral_constant<int, QB_E5M2FNUZ>{}); break;
    default: f(std::integral_constant<int, QB_I8>{}); break;
  }
}

// 2^e for small integer e, as a compile-time float.
constexpr float pow2(int e) { return e >= 0 ? float(1u << e) : 1.0f / float(1u << -e); }

// A static scale (or scale_ub) that is not positive and finite becomes NaN, so that every q it
// gives is NaN (0 in int8): refusing it on the host would cost a device sync.
QB_DEV float checked_scale(float s) { return (s > 0.0f && s < __builtin_inff()) ? s : __builtin_nanf(""); }

// max(min(amax, *scale_ub) / qmax, 1 / (qmax * 512)). Comparisons, not fminf / fmaxf, so that a NaN
// amax or scale_ub gives a NaN scale (torch.minimum and torch.clamp propagate NaN).
template <int QD>
QB_DEV float dynamic_scale(float amax, const float* scale_ub) {
  constexpr float qmax = Format<QD>::qmax;
  constexpr float min_scale = 1.0f / (qmax * 512.0f);  // correctly rounded at compile time
  if (scale_ub != nullptr) {
    const float ub = checked_scale(*scale_ub);
    amax = __builtin_isnan(ub) ? ub : (amax > ub ? ub : amax);
  }
  const float s = amax / qmax;
  return s < min_scale ? min_scale : s;
}

// One quotient x / scale to its byte. fp8: clamp to +-qmax (infinities included), round to nearest
// even; int8: round half to even, clamp to [-128, 127]. Both are written with selects, not branches,
// for the reason f16_to_f32 gives.
template <int QD>
QB_DEV uint8_t encode(float v) {
  const bool nan = __builtin_isnan(v);
  if constexpr (QD == QB_I8) {
    const float r = __builtin_fminf(__builtin_fmaxf(__builtin_rintf(v), -128.0f), 127.0f);
    return nan ? 0 : static_cast<uint8_t>(static_cast<int8_t>(r));  // int8 has no NaN
  } else {
    using F = Format<QD>;
    constexpr float min_normal = pow2(1 - F::bias), steps_per_unit = pow2(F::bias - 1 + F::mant);
    constexpr int shift = 23 - F::mant;
    const uint32_t sign = (bits_of(v) >> 24) & 0x80u;
    const float a = __builtin_fminf(__builtin_fabsf(v), F::qmax);  // a NaN v gives qmax here; see the end
    // Below the smallest normal: a count of subnormal steps (2^(1 - bias - mant)); scaling by a power of
    // two is exact and rint rounds half to even. A count of 2^mant is the smallest normal, whose
    // encoding is that same count.
    const uint32_t subnormal = static_cast<uint32_t>(__builtin_rintf(a * steps_per_unit));
    // Otherwise round fp32's 23 mantissa bits to `mant` (half to even; a carry moves into the
    // exponent) and rebias the exponent. a <= qmax, which is on the grid, so the code is at most qmax's.
    uint32_t b = bits_of(a);
    b += (1u << (shift - 1)) - 1u + ((b >> shift) & 1u);
    const uint32_t normal = (b >> shift) - (uint32_t(127 - F::bias) << F::mant);
    const uint32_t mag = a < min_normal ? subnormal : normal;
    // fnuz has no -0 (0x80 is its NaN): a zero is 0x00 whatever its sign.
    const uint8_t byte = static_cast<uint8_t>(F::fnuz && mag == 0 ? 0u : sign | mag);
    return nan ? F::nan : byte;
  }
}

}  // namespace qbr
