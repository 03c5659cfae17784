/* qbackend_cuda.h: the C ABI of libqbackend_cuda.
 *
 * Every entry point takes raw device pointers, sizes, strides (in elements), dtype codes and a
 * cudaStream_t passed as void*, and returns a qb_status code (QB_OK == 0). On failure it writes a
 * NUL-terminated, human-readable message into err (at most err_len bytes, err may be NULL) and
 * never aborts the process. Kernels run on the calling thread's current CUDA device.
 * Nothing here depends on libtorch; the library links cudart statically and never libcuda.
 */
#ifndef QBACKEND_CUDA_H
#define QBACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QB_ABI_VERSION 1

typedef enum qb_status {
  QB_OK = 0,
  QB_ERR_INVALID_ARGUMENT = 1, /* a pointer, size, stride or code breaks a stated rule */
  QB_ERR_UNSUPPORTED = 2,      /* valid request this build or device cannot serve */
  QB_ERR_NOT_BUILT = 3,        /* the kernel variant was not compiled into this library */
  QB_ERR_CUDA = 4              /* a CUDA runtime call or kernel launch failed */
} qb_status;

typedef enum qb_dtype {
  QB_F32 = 0,
  QB_F16 = 1,
  QB_BF16 = 2,
  QB_E4M3 = 3, /* float8_e4m3fn */
  QB_E5M2 = 4, /* float8_e5m2 */
  QB_I8 = 5,
  QB_I32 = 6
} qb_dtype;

/* How a scale vector covers its operand. */
typedef enum qb_scale_kind {
  QB_SCALE_TENSOR = 0, /* one fp32 value */
  QB_SCALE_ROW = 1,    /* scale_a: one per row of A ([M], per-token); scale_b: one per column of B ([N], per-channel) */
  QB_SCALE_BLOCK = 2   /* block scaling (DeepSeek-style), e4m3 only, set for both scales at once: scale_a
                          [M, ceil(K/128)] row-major (1 x 128 groups along each row of A), scale_b
                          [ceil(K/128), ceil(N/128)] row-major (128 x 128 blocks of B); see
                          qb_scaled_mm_block_workspace_size */
} qb_scale_kind;

/* Kernel family to run. QB_VARIANT_AUTO picks the best one compiled for the current device. The
 * others force a family so that PTX-embedded older-arch kernels can be verified on newer chips. */
typedef enum qb_variant {
  QB_VARIANT_AUTO = 0,
  QB_VARIANT_SM90 = 90, /* sm_90a: TMA + WGMMA, warp-specialized (fp8, int8, w8a16, block-scaled fp8) */
  QB_VARIANT_SM89 = 89, /* sm_89 / compute_89: mma.sync e4m3 (CUTLASS 2.x) */
  QB_VARIANT_SM80 = 80, /* sm_80 / compute_80: cp.async, mma.sync m16n8k16 (int8 GEMM, marlin) */
  QB_VARIANT_SM75 = 75  /* sm_75 / compute_75: mma.sync m16n8k8 / m8n8k16 (int8 GEMM, marlin) */
} qb_variant;

/* OR'ed into a scaled_mm call's `variant` (and into the variant of its workspace and config queries):
 * e4m3 W8A8 with the tensor cores' partial sums promoted into fp32 registers after every 128-deep K
 * tile (accumulate="precise"), instead of fast accumulation. The sm_90a family only (op
 * "scaled_mm_fp8_precise" in qb_has_variant); other families answer QB_ERR_NOT_BUILT. INT8, W8A16
 * and block-scaled calls are precise anyway and ignore it. (ABI 1 addition.) */
#define QB_ACCUMULATE_PRECISE 0x1000

/* Library facts: ABI version, the compiled archs (e.g. "sm_89 sm_90a compute_75 compute_80 compute_89"),
 * and the kernel variants present. Written as "key=value" lines into buf. Returns QB_OK. */
int qb_build_info(char* buf, size_t buf_len);

/* Nonzero when kernels of variant (for the given op: "scaled_mm_fp8", "scaled_mm_fp8_precise",
 * "scaled_mm_fp8_block", "scaled_mm_int8", "scaled_mm_w8a16", "grouped_scaled_mm_fp8", "quantize",
 * "quantize_group", "marlin") were compiled into this library. */
int qb_has_variant(const char* op, int variant);

/* out[M, N] = (scale_a * scale_b) * (A @ B) + bias, fp32 (fp8) or int32 (int8) accumulation.
 *   a:   [M, K] row-major, element (m, k) at a[m * lda + k]; lda >= K.
 *   b:   [K, N] column-major, element (k, n) at b[n * ldb + k]; ldb >= K (b = w.t() of a row-major [N, K] weight).
 *   out: [M, N] row-major, element (m, n) at out[m * ldo + n]; ldo >= N.
 *   a_dtype == b_dtype in {QB_E4M3, QB_I8} (e5m2 mixes: QB_ERR_UNSUPPORTED unless stated by qb_has_variant).
 *   out_dtype in {QB_BF16, QB_F16} (QB_F32 where supported).
 *   scale_a: fp32, [1] or [M] per scale_a_kind; scale_b: fp32, [1] or [N] per scale_b_kind.
 *   W8A16 (op "scaled_mm_w8a16", the SM90 variant only): a_dtype QB_BF16 or QB_F16, b_dtype QB_E4M3,
 *   out_dtype == a_dtype, scale_a NULL (scale_a_kind ignored): out = scale_b * (A @ B) + bias, the
 *   e4m3 weights converted exactly to a's dtype, fp32 accumulation; K % 16 == 0, N % 8 == 0, lda % 8.
 *   bias: NULL or [N] contiguous in out_dtype.
 *   Rules checked (QB_ERR_INVALID_ARGUMENT): non-NULL a/b/out/scales, M >= 0, N, K > 0,
 *   K % 16 == 0, N % 16 == 0 (fp8/int8), 16-byte aligned a, b, out, lda, ldb and ldo.
 * M == 0 returns QB_OK and launches nothing. */
int qb_scaled_mm(const void* a, int64_t lda, const void* b, int64_t ldb, void* out, int64_t ldo,
                 int64_t M, int64_t N, int64_t K, int a_dtype, int b_dtype, int out_dtype,
                 const float* scale_a, int scale_a_kind, const float* scale_b, int scale_b_kind,
                 const void* bias, int variant, void* stream, char* err, size_t err_len);

/* Additions (ABI 1, after the first draft):
 *
 * qb_scaled_mm_ws is qb_scaled_mm with a caller-provided device workspace, which lets the library
 * split K across SMs (split-K / stream-K) when the output tiles alone would not fill the GPU
 * (small M, or few tiles). qb_scaled_mm_workspace_size says how many bytes that takes on the
 * current device for this problem (0: none). Passing less (or NULL) is never an error: the library
 * then uses a plan that needs no workspace, which may be slower. The workspace is scratch for this
 * call alone (stream-ordered: reusable once the call's kernels have run on `stream`); the library
 * never allocates device memory itself, so both calls are CUDA-graph capturable. */
size_t qb_scaled_mm_workspace_size(int64_t M, int64_t N, int64_t K, int a_dtype, int out_dtype, int variant);

int qb_scaled_mm_ws(const void* a, int64_t lda, const void* b, int64_t ldb, void* out, int64_t ldo,
                    int64_t M, int64_t N, int64_t K, int a_dtype, int b_dtype, int out_dtype,
                    const float* scale_a, int scale_a_kind, const float* scale_b, int scale_b_kind,
                    const void* bias, int variant, void* workspace, size_t workspace_size, void* stream,
                    char* err, size_t err_len);

/* Block scaling (QB_SCALE_BLOCK, ABI 1 addition): qb_scaled_mm / qb_scaled_mm_ws with both scale
 * kinds QB_SCALE_BLOCK run the block-scaled FP8 family (sm_90a only; K a multiple of 16, N of 8;
 * K and N need not be multiples of 128: the last group or block may be partial). The products of
 * each 128-deep K block are scaled and summed in fp32 (no fast-accumulation drift). Its workspace
 * query and its configs (for qb_scaled_mm_override) are these: */
size_t qb_scaled_mm_block_workspace_size(int64_t M, int64_t N, int64_t K, int out_dtype, int variant);
int qb_scaled_mm_block_config_count(int variant);
const char* qb_scaled_mm_block_config_name(int variant, int config);

/* Grouped scaled_mm: the expert layers of a mixture of experts in one call (ABI 1 addition; op
 * "grouped_scaled_mm_fp8" in qb_has_variant: the sm89 family, mma.sync e4m3, which newer GPUs run
 * through its PTX, and on compute capability 9.0 the sm90 family, TMA + WGMMA, given its workspace). Group g is rows [offsets[g-1], offsets[g]) of A (from row 0 for g = 0); its rows
 * of out are scaled_mm's of those rows with group g's weight, scales and bias:
 *   out[r, n] = (scale_a(r) * scale_b(g, n)) * sum_k A[r, k] B_g[k, n] + bias[g, n]   (fp32 accumulation)
 * or, with block scales, the sum over 128-deep K blocks of each block's products times its two scales.
 *   a:   [M, K] e4m3 row-major, row stride lda (elements = bytes); rows sorted by group.
 *   b:   [G, K, N] e4m3, group g column-major: element (g, k, n) at b[g * ldb_group + n * ldb + k], ldb >= K
 *        (b = w.transpose(-2, -1) of a row-major [G, N, K] expert weight: ldb = K, ldb_group = N * K).
 *   out: [M, N] row-major, row stride ldo, out_dtype QB_BF16 or QB_F16.
 *   offsets: int32 [G] on the device, cumulative row ends. Never read on the host, so the call is
 *        capturable in a CUDA graph while the routing changes between replays. The kernels clamp each
 *        end to [the previous end, M]; rows at or past the last end are written as NaN (malformed
 *        offsets give NaN or misrouted rows, never an out-of-bounds access).
 *   scale_a_kind / scale_b_kind, each QB_SCALE_TENSOR or QB_SCALE_ROW, or both QB_SCALE_BLOCK:
 *        QB_SCALE_TENSOR  scale_a [1];  scale_b [G] (one per group)
 *        QB_SCALE_ROW     scale_a [M] (per token);  scale_b [G, N] row-major (per group and column)
 *        QB_SCALE_BLOCK   scale_a [M, ceil(K/128)] row-major;  scale_b [G, ceil(K/128), ceil(N/128)] contiguous
 *   bias: NULL or [G, N] contiguous in out_dtype.
 *   Rules (QB_ERR_INVALID_ARGUMENT): 1 <= G <= 1024, K % 16 == 0, N % 8 == 0, M >= 0; a, b, out
 *   16-byte aligned and lda, ldb, ldb_group, ldo * 2 multiples of 16 bytes; scales and offsets 4-byte
 *   aligned. M == 0 returns QB_OK and launches nothing. variant: QB_VARIANT_AUTO, QB_VARIANT_SM89 or
 *   QB_VARIANT_SM90. qb_grouped_scaled_mm_override forces a config of the family that runs for the
 *   calling thread's later calls (tests; -1: automatic). */
int qb_grouped_scaled_mm(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t ldb_group, void* out,
                         int64_t ldo, const int32_t* offsets, int64_t M, int64_t N, int64_t K, int64_t groups,
                         int a_dtype, int b_dtype, int out_dtype, const float* scale_a, int scale_a_kind,
                         const float* scale_b, int scale_b_kind, const void* bias, int variant, void* stream,
                         char* err, size_t err_len);
int qb_grouped_scaled_mm_config_count(int variant);
const char* qb_grouped_scaled_mm_config_name(int variant, int config);
void qb_grouped_scaled_mm_override(int config);

/* qb_grouped_scaled_mm_ws is qb_grouped_scaled_mm with a caller-provided device workspace (256-byte
 * aligned), which the sm90 family needs: it writes each group's problem size and its operand, scale
 * and bias pointers there on the device (from offsets, so still no host sync) before its GEMM. The workspace is
 * scratch for this call alone, stream-ordered as qb_scaled_mm_ws's. qb_grouped_scaled_mm_workspace_size
 * says how many bytes the automatic choice (or variant) wants on the current device for these sizes,
 * scale kind (QB_SCALE_*) and bias (nonzero: present); 0 when the sm89 family serves them. With less
 * (or NULL), QB_VARIANT_AUTO runs the sm89 family and QB_VARIANT_SM90 is QB_ERR_INVALID_ARGUMENT. */
size_t qb_grouped_scaled_mm_workspace_size(int64_t M, int64_t N, int64_t K, int64_t groups, int out_dtype,
                                           int scale_kind, int has_bias, int variant);
int qb_grouped_scaled_mm_ws(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t ldb_group, void* out,
                            int64_t ldo, const int32_t* offsets, int64_t M, int64_t N, int64_t K, int64_t groups,
                            int a_dtype, int b_dtype, int out_dtype, const float* scale_a, int scale_a_kind,
                            const float* scale_b, int scale_b_kind, const void* bias, int variant, void* workspace,
                            size_t workspace_size, void* stream, char* err, size_t err_len);

/* Tuning and tests only. Kernel configs of a (resolved, non-AUTO) variant for a dtype: their
 * count, and their names (NULL past the end). qb_scaled_mm_override forces, for the calling
 * thread's later scaled_mm calls, a config (-1: automatic), a work decomposition for stream-K
 * capable configs (-1 automatic, 0 data-parallel, 1 split-K, 2 stream-K, 3 CUTLASS heuristic), a
 * split-K factor (used with decomposition 1) and a tile swizzle (SM90: 1, 2, 4 or 8). The SM90
 * small-M configs (names "stream_*") take the split factor as their cluster size (1 to 8, whatever
 * the decomposition: the CTAs of a cluster split the K range of its last tile) and the swizzle as
 * the tiles each CTA streams alone before that shared one (< 0: none); a split factor < 1 gives
 * them their own automatic plan.
 * qb_scaled_mm_override(-1, -1, -1, -1) restores the automatic choice. A forced config that cannot
 * run a problem fails with QB_ERR_UNSUPPORTED. */
int qb_scaled_mm_config_count(int a_dtype, int variant);
const char* qb_scaled_mm_config_name(int a_dtype, int variant, int config);
void qb_scaled_mm_override(int config, int decomposition, int splits, int swizzle);

/* Which config the automatic choice runs for an M x N x K problem on a GPU with sm_count
 * multiprocessors, without a GPU: the config id (see qb_scaled_mm_config_name) and its
 * decomposition, split count and swizzle (for the small-M configs: the cluster size and the tiles
 * per CTA before the shared one), as qb_scaled_mm_override would take them. Stream-K needs the
 * caller's workspace; without one the same config runs data-parallel. Only the sm90 FP8 family
 * (variant 90, a_dtype QB_E4M3) answers; others return QB_ERR_UNSUPPORTED. Returns QB_OK or an error code with a message in err. */
int qb_scaled_mm_auto_config(int64_t M, int64_t N, int64_t K, int a_dtype, int variant, int sm_count, int* config,
                             int* decomposition, int* splits, int* swizzle, char* err, size_t err_len);

/* Whole token tiles. The sm_90a FP8 kernels load tokens in tiles of 64 to 128 rows; where a tile
 * reaches past the last row of A, the copy fills the missing rows with zeros, which is slow when
 * many are missing (up to x1.5 the time of the same GEMM on whole tiles). When A and a per-token
 * scale_a have storage past row M, the GEMM can run on those rows instead: each output row depends
 * only on its own row of A and of scale_a, so rows past M may hold anything and their outputs are
 * simply not used.
 *   N == 0: how many rows to give an activation buffer of M rows (and its per-token scales) so
 *           that any GEMM of M tokens can run on whole tiles: M or more.
 *   N > 0:  how many rows (M to rows_available) this M x N x K GEMM on a GPU of sm_count
 *           multiprocessors (< 1: 132) should run on, its A and scale_a having storage for
 *           rows_available rows; out must then have that many rows.
 * Only the sm90 FP8 family (variant 90, a_dtype QB_E4M3) pads; any other variant, dtype or malformed
 * request answers M. Needs no GPU. */
int64_t qb_scaled_mm_token_rows(int64_t M, int64_t N, int64_t K, int a_dtype, int variant, int sm_count,
                                int64_t rows_available);

/* Process-wide, on by default, sm_90 and newer only: the SM90 scaled_mm kernels that need no
 * workspace, and the single-kernel quantize modes (static per-tensor, dynamic per-token), are launched
 * as programmatic dependents of the previous kernel in the stream (PDL), so their launch and prologue
 * overlap its tail. Each waits for that kernel to finish (griddepcontrol.wait) before it reads or
 * writes global memory (the small-M GEMM asks L2 to prefetch its first weight tiles before that:
 * a prefetch reads nothing into the SM). 0 turns this off (plain stream-ordered launches). */
void qb_set_programmatic_launch(int enabled);

/* Quantize modes. */
typedef enum qb_quant_mode {
  QB_QUANT_STATIC_TENSOR = 0,  /* scale is an input: one fp32 value */
  QB_QUANT_DYNAMIC_TENSOR = 1, /* scale is an output: one fp32 value over the whole [rows, cols] tensor */
  QB_QUANT_DYNAMIC_TOKEN = 2,  /* scale is an output: one fp32 value per row ([rows]) */
  QB_QUANT_DYNAMIC_GROUP = 3   /* qb_quantize_group only: one fp32 value per `group` columns of a row */
} qb_quant_mode;

/* q = saturate(x / scale) with, for dynamic modes, scale = max(min(amax, *scale_ub) / qmax, 1 / (qmax * 512)).
 * amax is the max |x| over the tensor (DYNAMIC_TENSOR) or over each row (DYNAMIC_TOKEN), in fp32.
 * qmax: 448 (QB_E4M3), 57344 (QB_E5M2), 127 (QB_I8). The division is IEEE fp32 (round to nearest),
 * fp8 conversion rounds to nearest even and saturates to +-qmax, int8 rounds half to even and
 * saturates to [-128, 127]. Results are bit-identical to the reference provider.
 *   x: [rows, cols], element (r, c) at x[r * ldx + c], x_dtype in {QB_F32, QB_F16, QB_BF16}.
 *   q: [rows, cols], element (r, c) at q[r * ldq + c], q_dtype in {QB_E4M3, QB_E5M2, QB_I8}.
 *   scale: fp32 device pointer: read for STATIC_TENSOR, written for the dynamic modes.
 *   scale_ub: NULL or a device pointer to one fp32 upper bound on amax (dynamic modes only).
 *   workspace: NULL, or for DYNAMIC_TENSOR at least qb_quantize_workspace_size() bytes of device memory.
 * rows == 0 returns QB_OK. */
int qb_quantize(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t rows, int64_t cols,
                int x_dtype, int q_dtype, int mode, const float* scale_ub, void* workspace, void* stream,
                char* err, size_t err_len);

size_t qb_quantize_workspace_size(int64_t rows, int64_t cols, int mode);

/* Per-token-group dynamic quantize (the activations of block-scaled FP8): for each row r and each
 * group g of `group` consecutive columns (the last group of a row is shorter when group does not
 * divide cols), scale[r * ld_scale + g] = max(amax / qmax, 1 / (qmax * 512)) over that group, and
 * q = saturate(x / scale) over it; numerics and non-finite rules as qb_quantize, bit-identical to the
 * reference provider. scale: [rows, ld_scale] fp32 row-major, ld_scale >= ceil(cols / group): the
 * layout the block-scaled scaled_mm reads (QB_SCALE_BLOCK scale_a). One kernel, no workspace,
 * capturable in CUDA graphs. rows == 0 returns QB_OK. */
int qb_quantize_group(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t ld_scale, int64_t rows,
                      int64_t cols, int64_t group, int x_dtype, int q_dtype, void* stream, char* err, size_t err_len);

/* Gather and quantize in one pass (a MoE layer's routed activations, quantized once in expert order):
 * row r of q (and its scales) is the dynamic quantize of row index[r] of x. group == 0: per token,
 * scale[r] (ld_scale unused); group > 0: per token group, scale[r * ld_scale + g], as qb_quantize_group.
 * Numerics are those of qb_quantize / qb_quantize_group on the gathered rows, bit for bit.
 *   x: [x_rows, cols] with row stride ldx; index: `rows` int64 device values.
 * An index outside [0, x_rows) is not checked on the host (that would need a sync): its row reads
 * row 0 of x and its scales are NaN. One kernel, no workspace, capturable. rows == 0 returns QB_OK. */
int qb_quantize_gather(const void* x, int64_t ldx, int64_t x_rows, const int64_t* index, void* q, int64_t ldq,
                       float* scale, int64_t ld_scale, int64_t rows, int64_t cols, int64_t group, int x_dtype,
                       int q_dtype, void* stream, char* err, size_t err_len);

/* The activation of a gated MLP quantized in the same pass (a MoE layer's SiLU(gate) * up, ABI 1
 * addition): row r of x is [gate | up], cols columns each (ldx >= 2 * cols); the row quantized is
 * act = (SiLU(gate) * up in fp32, SiLU(g) = g / (1 + exp(-g)) as torch computes it on a GPU) rounded
 * to x_dtype, per token (group == 0: scale[r]) or per token group (group > 0: scale[r * ld_scale + g]),
 * with the numerics of qb_quantize / qb_quantize_group on act, bit for bit. x_dtype f16 or bf16.
 * One kernel, no workspace, capturable. rows == 0 returns QB_OK. */
int qb_quantize_silu_mul(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t ld_scale,
                         int64_t rows, int64_t cols, int64_t group, int x_dtype, int q_dtype, void* stream,
                         char* err, size_t err_len);

/* Tuning and tests only: for the calling thread's later dynamic quantize calls, force the kernel
 * (token_kernel: -1 automatic; per token, 0 one block per row and 1 persistent row-pipelined where
 * the row fits; per group, 2 the warp-per-group kernel where a block per row would run) and the
 * block-per-row kernels' 16-byte vectors per thread (row_vecs: 0 automatic; 1, 2 or 4, and 3 runs
 * as 2; the scalar path for unaligned rows always takes 4).
 * Every choice gives identical results. */
void qb_quantize_override(int token_kernel, int row_vecs);

#ifdef __cplusplus
}
#endif

#include "qbackend_marlin.h" /* W8A16 entry points (csrc_cuda/marlin) */

#endif /* QBACKEND_CUDA_H */
