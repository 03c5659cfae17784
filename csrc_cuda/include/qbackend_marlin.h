/* qbackend_marlin.h: W8A16 entry points of libqbackend_cuda (FP8 e4m3fn weights, fp16/bf16 activations).
 *
 * Included by qbackend_cuda.h; same conventions: raw device pointers, sizes and strides in elements,
 * a cudaStream_t passed as void*, a qb_status return code and a NUL-terminated message written into
 * err (at most err_len bytes, err may be NULL). Nothing here aborts, prints, synchronizes the host
 * or allocates: qb_marlin_mm can be captured into a CUDA graph.
 *
 * Math:  out[m, n] = scale[n or 0] * sum_k a[m, k] * w[n, k]  (+ bias[n]),  fp32 accumulation,
 *        rounded once to the activation dtype. The e4m3fn weights are decoded exactly (see below).
 *
 * Usage:
 *   1. at load time: packed = device buffer of qb_marlin_packed_bytes(N, K) bytes;
 *      qb_marlin_prepare(w, ldw, N, K, act_dtype, packed, ...)  (a GPU repack for the activation dtype
 *      the weight will be multiplied with; nothing is repacked per call);
 *   2. once per device and stream: workspace = qb_marlin_workspace_bytes(N, K) bytes, ZEROED once
 *      (cudaMemset / torch.zeros). Every launch returns it to all-zero counters, so it is reused as
 *      is, but two launches that may run concurrently (different streams) need different workspaces;
 *   3. per call: qb_marlin_mm(...).
 *
 * Packed layout (opaque to callers; described for the curious): the weight is cut into tiles of
 * 128 rows (n) x 128 columns (k), N and K zero-padded up to multiples of 128. Tile (t, kt) is 16 KiB
 * at offset (t * ceil(K/128) + kt) * 16384, so one thread block streams one contiguous byte range.
 * A tile holds 16 blocks of 16 (k) x 64 (n) weights in the order (n half, k16 step); each block is
 * exactly the mma.m16n8k16 B fragments of one warp: lane l's 32 bytes (two 16-byte pieces, 512 bytes
 * apart) hold, for the 8 columns n8 = 0..7, the weights (n8*8 + l/4, k0 + {0,1,8,9}), k0 = 2*(l%4),
 * 4 weights per 32-bit word with the sign and 7-bit magnitude fields re-placed so that decoding takes
 * few integer ops per half2 (qb_marlin_prepare does the re-placement). The placement depends on the
 * activation dtype (fp16 and bf16 want the magnitude at different bits; a word can hold only one
 * half2's fields where the decode wants them, and the placement keeps the other half2's cheap to
 * move), so a weight packed for one dtype must be multiplied with activations of that dtype only.
 *
 * Exact decoding: an e4m3fn code s.eeee.mmm with its magnitude shifted into an fp16 as
 * s.0eeee.mmm0000000 is, as fp16, exactly the code's value times 2^-8: normal codes (e >= 1) have
 * value 2^(e-7)(1+m/8) and the fp16 reads 2^(e-15)(1+m/8); subnormal codes (e = 0) have 2^-6 (m/8)
 * and the fp16 subnormal reads 2^-14 (m/8). The tensor cores take these fp16 values (subnormals
 * included) as they are, and the factor 2^8 joins the weight scale in the epilogue: every product
 * and fp32 sum is exactly 2^-8 times the one with the true weights, so the result is the same. For
 * bf16 the field goes to s.0000eeee.mmm0000 = value times 2^-120 (bf16 has the fp32 exponent bias
 * 127; e = 0 lands on a bf16 subnormal 2^-126 (m/8)); there one bf16 multiply by 2^120 per pair
 * restores the value exactly before the MMA, because 2^-120 times an activation could leave the
 * fp32 normal range. The NaN codes 0x7F and
 * 0xFF have no image: they would decode as +-480. qb_marlin_prepare counts them (nan_count) so the
 * caller can refuse such a weight; checkpoints produced by saturating quantizers contain none.
 *
 * Variants: QB_VARIANT_SM80 (cp.async pipeline, ldmatrix, mma.m16n8k16, fp16 and bf16; needs
 * compute capability >= 8.0) and QB_VARIANT_SM75 (register-staged loads, ldmatrix, mma.m16n8k8,
 * fp16 only; >= 7.5). bf16 activations on the SM75 variant are REFUSED with QB_ERR_UNSUPPORTED:
 * sm_75 tensor cores have no bf16 MMA, and converting bf16 to fp16 would overflow above 65504 and lose
 * small values, which changes the math. QB_VARIANT_AUTO picks SM80 on cc >= 8.0, else SM75.
 *
 * Constraints (checked, QB_ERR_INVALID_ARGUMENT with a message):
 *   N >= 1, K >= 1, N % 8 == 0, K % 8 == 0, M >= 0, N, K < 2^31 (M == 0: QB_OK once the sizes, codes
 *   and variant pass, nothing launched, a and out may be NULL);
 *   a, out, packed, w_scale non-NULL; a, out and packed 16-byte aligned; lda % 8 == 0, ldo % 8 == 0
 *   (16-byte rows), lda >= K, ldo >= N; bias NULL or 4-byte aligned [N] of act_dtype;
 *   w_scale 4-byte aligned fp32, [1] (QB_SCALE_TENSOR) or [N] (QB_SCALE_ROW);
 *   packed_bytes >= qb_marlin_packed_bytes(N, K); workspace non-NULL with
 *   workspace_bytes >= qb_marlin_workspace_bytes(N, K) on the current device.
 * M is unbounded: rows are processed in chunks of 64 (one launch per chunk, all on `stream`).
 */
#ifndef QBACKEND_MARLIN_H
#define QBACKEND_MARLIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nonzero when the marlin kernels of `variant` (QB_VARIANT_SM80 or QB_VARIANT_SM75; QB_VARIANT_AUTO:
 * either) were compiled into this library. */
int qb_marlin_has_variant(int variant);

/* Bytes of the packed weight for an [N, K] e4m3fn matrix: ceil(N/128) * ceil(K/128) * 16384
 * (0 when N or K < 1). */
size_t qb_marlin_packed_bytes(int64_t N, int64_t K);

/* Bytes of the workspace qb_marlin_mm needs for (N, K) on the calling thread's current device:
 * room for split-K partial sums (4 x 32 KiB per multiprocessor, whatever the shape) followed by one
 * int counter per 128 rows of N. Independent of M and K; a workspace sized for the largest N serves
 * every smaller shape too (calls in sequence). Returns 0 on error (bad sizes, no device). */
size_t qb_marlin_workspace_bytes(int64_t N, int64_t K);

/* Repack w (e4m3fn, [N, K] row-major: element (n, k) at byte w[n * ldw + k], ldw >= K) into packed
 * (packed_bytes >= qb_marlin_packed_bytes(N, K), 16-byte aligned) for activations of act_dtype
 * (QB_F16 or QB_BF16: qb_marlin_mm must then be called with that act_dtype; it cannot tell the
 * packings apart, and the other dtype would decode wrong weights). Asynchronous on `stream`.
 * nan_count: NULL or a device int32 that the kernel INCREMENTS by the number of NaN codes
 * (0x7F, 0xFF) in w; zero it before the call and read it after. Any N, K >= 1 is accepted here;
 * qb_marlin_mm adds its own rules. Rules checked: act_dtype QB_F16 or QB_BF16, non-NULL w/packed,
 * 16-byte aligned packed. */
int qb_marlin_prepare(const void* w, int64_t ldw, int64_t N, int64_t K, int act_dtype, void* packed,
                      size_t packed_bytes, int32_t* nan_count, void* stream, char* err, size_t err_len);

/* out[M, N] = w_scale * (a @ w^T) (+ bias) in the activation dtype (see the top of this file).
 *   a:   [M, K] row-major, element (m, k) at a[m * lda + k], act_dtype QB_F16 or QB_BF16.
 *   packed_w: from qb_marlin_prepare for this (N, K) and this act_dtype.
 *   out: [M, N] row-major, element (m, n) at out[m * ldo + n], act_dtype.
 *   w_scale: fp32 device pointer, scale_kind QB_SCALE_TENSOR ([1]) or QB_SCALE_ROW ([N], per output
 *            channel).
 *   bias: NULL or [N] contiguous, act_dtype.
 *   workspace: see qb_marlin_workspace_bytes (zeroed once, reused, one per concurrent stream).
 *   variant: QB_VARIANT_AUTO, QB_VARIANT_SM80 or QB_VARIANT_SM75.
 * Status: QB_ERR_INVALID_ARGUMENT (a rule above), QB_ERR_NOT_BUILT (variant not compiled in),
 * QB_ERR_UNSUPPORTED (device too old for the variant, bf16 on SM75), QB_ERR_CUDA (launch failed). */
int qb_marlin_mm(const void* a, int64_t lda, const void* packed_w, size_t packed_bytes, void* out, int64_t ldo,
                 int64_t M, int64_t N, int64_t K, int act_dtype, const float* w_scale, int scale_kind,
                 const void* bias, void* workspace, size_t workspace_bytes, int variant, void* stream,
                 char* err, size_t err_len);

/* out[N, K] = w_scale * w in the activation dtype, each element rounded once: packed_w (from
 * qb_marlin_prepare for act_dtype) back to a dense row-major matrix, element (n, k) at out[n * ldo + k],
 * for GEMMs with more rows than qb_marlin_mm is built for (the caller then runs a dense GEMM).
 * w_scale: fp32, scale_kind QB_SCALE_TENSOR ([1]) or QB_SCALE_ROW ([N]). Rules: K a multiple of 16,
 * ldo even and >= K, out 4-byte aligned. The SM80 family's kernel: QB_ERR_UNSUPPORTED below sm_80,
 * QB_ERR_NOT_BUILT without that family. Asynchronous on `stream`, graph-capturable. */
int qb_marlin_unpack(const void* packed_w, size_t packed_bytes, int64_t N, int64_t K, int act_dtype,
                     const float* w_scale, int scale_kind, void* out, int64_t ldo, void* stream, char* err,
                     size_t err_len);

/* Same as qb_marlin_mm with tuning knobs for benchmarks and tests (0 = automatic):
 * stages: cp.async pipeline depth of the SM80 variant (2..12, capped by shared memory; ignored by
 * SM75); max_blocks: upper bound on the thread blocks per launch; blocks_per_sm: 1 or 2 resident
 * blocks per multiprocessor (default: 2 for up to 16 rows per launch on SM80, else 1; fewer when the
 * occupancy query says so). */
int qb_marlin_mm_tuned(const void* a, int64_t lda, const void* packed_w, size_t packed_bytes, void* out,
                       int64_t ldo, int64_t M, int64_t N, int64_t K, int act_dtype, const float* w_scale,
                       int scale_kind, const void* bias, void* workspace, size_t workspace_bytes, int variant,
                       int stages, int max_blocks, int blocks_per_sm, void* stream, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* QBACKEND_MARLIN_H */
