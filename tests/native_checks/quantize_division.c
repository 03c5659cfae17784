/* The exact division of csrc_cuda/common/quantize.cu (Divisor::quotient), written again in host C:
 * with r = RN(1/s) and q0 = RN(x r), q1 = RN(q0 + RN(x - q0 s) r) (both steps fused multiply-adds),
 * its sign taken from q0. The quantize kernels rely on two facts about it, checked here:
 *
 *   qmax Q       every finite non-negative fp32 a: q1(a, qmax) equals a / qmax wherever a / qmax is at
 *                least 2^-40 (scale_from_amax; smaller scales are clamped to min_scale either way).
 *                Prints the number of mismatches at quotients >= 2^-40 (must be 0).
 *   random N     N random pairs (x, s), s within [2^-60, 2^60], |q0| within [2^-40, 2^60) (Divisor's
 *                fast path): q1 equals x / s. Prints the number of mismatches (must be 0).
 *
 * Build with -ffp-contract=off so that only the spelled-out fmaf calls fuse. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static float quotient(float x, float s, float r) {
  const float q0 = x * r;
  return copysignf(fmaf(fmaf(-q0, s, x), r, q0), q0);
}

static int same(float a, float b) { return a == b && signbit(a) == signbit(b); }

static long check_qmax(float qmax) {
  const float r = 1.0f / qmax;
  long bad = 0;
  for (uint32_t u = 0; u < 0x7f800000u; ++u) { /* every finite non-negative float */
    const float a = from_bits(u);
    const float exact = a / qmax;
    if (exact >= 0x1p-40f && !same(quotient(a, qmax, r), exact)) ++bad;
  }
  return bad;
}

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) { /* xorshift64* */
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return (uint32_t)((state * 0x2545F4914F6CDD1Dull) >> 32);
}

static long check_random(long n) {
  long bad = 0, tried = 0;
  while (tried < n) {
    const float s = from_bits(next_u32() & 0x7fffffffu);
    const float x = from_bits(next_u32());
    if (!(fabsf(s) >= 0x1p-60f && fabsf(s) <= 0x1p60f) || isnan(x) || isinf(x)) continue;
    const float r = 1.0f / s;
    const float q0 = x * r;
    if (!(fabsf(q0) >= 0x1p-40f && fabsf(q0) < 0x1p60f)) continue;
    ++tried;
    if (!same(quotient(x, s, r), x / s)) ++bad;
  }
  return bad;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "qmax") == 0) {
    printf("%ld\n", check_qmax(strtof(argv[2], NULL)));
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "random") == 0) {
    printf("%ld\n", check_random(atol(argv[2])));
    return 0;
  }
  fprintf(stderr, "usage: %s qmax Q | random N\n", argv[0]);
  return 2;
}
