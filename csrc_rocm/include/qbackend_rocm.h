/* qbackend_rocm.h: the C ABI of libqbackend_rocm, the HIP quantize kernels for AMD Instinct GPUs.
 *
 * The quantize entry points have the names, arguments and numerics of libqbackend_cuda's
 * (csrc_cuda/include/qbackend_cuda.h): code that calls one calls the other the same way, with the
 * fnuz formats added to the dtype codes. Every entry point takes raw device pointers, sizes,
 * strides (in elements), dtype codes and a hipStream_t passed as void*, returns a qb_status code
 * (QB_OK == 0), writes a NUL-terminated message into err (at most err_len bytes; err may be NULL)
 * on failure, and never aborts the process. Kernels run on the calling thread's current HIP device.
 * Nothing here depends on libtorch.
 */
#ifndef QBACKEND_ROCM_H
#define QBACKEND_ROCM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QB_ROCM_ABI_VERSION 1

/* Same codes as libqbackend_cuda's. */
typedef enum qb_status {
  QB_OK = 0,
  QB_ERR_INVALID_ARGUMENT = 1, /* a pointer, size, stride or code breaks a stated rule */
  QB_ERR_UNSUPPORTED = 2,      /* a valid request this build cannot serve */
  QB_ERR_NOT_BUILT = 3,        /* unused here; kept so the codes match libqbackend_cuda's */
  QB_ERR_RUNTIME = 4           /* a HIP runtime call or kernel launch failed */
} qb_status;

/* libqbackend_cuda's codes, and the two fnuz formats of gfx942 (MI300). */
typedef enum qb_dtype {
  QB_F32 = 0,
  QB_F16 = 1,
  QB_BF16 = 2,
  QB_E4M3 = 3,      /* float8_e4m3fn (OCP): bias 7, max 448, NaN 0x7F / 0xFF, has -0 */
  QB_E5M2 = 4,      /* float8_e5m2 (OCP): bias 15, max 57344, inf and NaN, has -0 */
  QB_I8 = 5,
  QB_I32 = 6,       /* not a quantize type; kept so the codes match */
  QB_E4M3FNUZ = 7,  /* float8_e4m3fnuz: bias 8, max 240, one NaN (0x80), no -0, no inf */
  QB_E5M2FNUZ = 8   /* float8_e5m2fnuz: bias 16, max 57344, one NaN (0x80), no -0, no inf */
} qb_dtype;

typedef enum qb_quant_mode {
  QB_QUANT_STATIC_TENSOR = 0,  /* scale is an input: one fp32 value */
  QB_QUANT_DYNAMIC_TENSOR = 1, /* scale is an output: one fp32 value over the whole [rows, cols] tensor */
  QB_QUANT_DYNAMIC_TOKEN = 2,  /* scale is an output: one fp32 value per row ([rows]) */
  QB_QUANT_DYNAMIC_GROUP = 3   /* qb_quantize_group only: one fp32 value per `group` columns of a row */
} qb_quant_mode;

/* Library facts as "key=value" lines: abi, archs (the gfx targets compiled in, comma-separated,
 * e.g. "gfx942,gfx950"; "cpu" for a build against the HIP-CPU runtime), hip_version, variants.<op>.
 * Returns QB_OK. */
int qb_build_info(char* buf, size_t buf_len);

/* Nonzero for op "quantize" or "quantize_group" and variant 0 (the only variant of this library). */
int qb_has_variant(const char* op, int variant);

/* q = saturate(x / scale); for the dynamic modes scale = max(min(amax, *scale_ub) / qmax, 1 / (qmax * 512))
 * with amax the max |x| over the tensor (DYNAMIC_TENSOR) or each row (DYNAMIC_TOKEN), in fp32.
 * qmax: 448 (QB_E4M3), 57344 (QB_E5M2, QB_E5M2FNUZ), 240 (QB_E4M3FNUZ), 127 (QB_I8). The division is
 * IEEE fp32 (round to nearest even); fp8 rounds to nearest even and saturates to +-qmax; int8 rounds
 * half to even and saturates to [-128, 127]. Non-finite values as docs/api.md ("Non-finite values"):
 * a granule with a NaN gets a NaN scale, an inf an inf scale; a NaN quantizes to the format's NaN
 * with the sign bit clear (0x7F OCP, 0x80 fnuz) or 0 (int8); fnuz has no -0, so a negative value
 * that rounds to zero is 0x00; a static scale or scale_ub that is not positive and finite becomes
 * NaN. Bit-identical to the reference provider.
 *   x: [rows, cols], element (r, c) at x[r * ldx + c], x_dtype in {QB_F32, QB_F16, QB_BF16}.
 *   q: [rows, cols], element (r, c) at q[r * ldq + c], q_dtype in {QB_E4M3, QB_E5M2, QB_E4M3FNUZ,
 *      QB_E5M2FNUZ, QB_I8}.
 *   scale: fp32 device pointer: read for STATIC_TENSOR, written for the dynamic modes.
 *   scale_ub: NULL or a device pointer to one fp32 upper bound on amax (dynamic modes only).
 *   workspace: NULL, or for DYNAMIC_TENSOR at least qb_quantize_workspace_size() bytes of device
 *   memory (without it the amax accumulates in `scale`, and one more one-thread kernel runs).
 * rows == 0 returns QB_OK and launches nothing. No allocation, no host sync. */
int qb_quantize(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t rows, int64_t cols,
                int x_dtype, int q_dtype, int mode, const float* scale_ub, void* workspace, void* stream,
                char* err, size_t err_len);

size_t qb_quantize_workspace_size(int64_t rows, int64_t cols, int mode);

/* Per-token-group dynamic quantize: for each row r and each group g of `group` consecutive columns
 * (the last group of a row is shorter when group does not divide cols),
 * scale[r * ld_scale + g] = max(amax / qmax, 1 / (qmax * 512)) over that group and q = saturate(x / scale)
 * over it; numerics and dtypes as qb_quantize. ld_scale >= ceil(cols / group): the [rows, ceil(cols / group)]
 * row-major layout block-scaled GEMMs read. group in [1, 2^30] (128 and 64 are the usual ones). */
int qb_quantize_group(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t ld_scale, int64_t rows,
                      int64_t cols, int64_t group, int x_dtype, int q_dtype, void* stream, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* QBACKEND_ROCM_H */
