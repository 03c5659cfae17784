// scaled_mm.cu: qb_scaled_mm's argument checks and the choice of kernel family.
//
// Everything that could make a kernel fault is checked here, before any family code runs, so the
// families may assume a well-formed request (qb::ScaledMmArgs). Families are compiled per arch
// (QB_HAS_<OP>_<VARIANT> says which are in this binary).
#include <stdio.h>

#include "qb_common.h"

namespace {

// Per-thread tuning override (qb_scaled_mm_override); -1 = automatic.
thread_local int t_config = -1;
thread_local int t_decomp = -1;
thread_local int t_splits = -1;
thread_local int t_swizzle = -1;

const char* dtype_name(int d) {
  switch (d) {
    case QB_F32: return "f32";
    case QB_F16: return "f16";
    case QB_BF16: return "bf16";
    case QB_E4M3: return "e4m3";
    case QB_E5M2: return "e5m2";
    case QB_I8: return "i8";
    case QB_I32: return "i32";
    default: return "unknown";
  }
}

// W8A16: 16-bit activations with an e4m3 weight (the only mixed pair).
bool is_w8a16(int a_dtype) { return a_dtype == QB_BF16 || a_dtype == QB_F16; }

// The family part of a `variant` argument; *precise: whether QB_ACCUMULATE_PRECISE was OR'ed into it.
int split_accumulate(int variant, bool* precise) {
  *precise = (variant & QB_ACCUMULATE_PRECISE) != 0;
  return variant & ~QB_ACCUMULATE_PRECISE;
}

// precise: accumulate="precise" (QB_ACCUMULATE_PRECISE), which only changes the family for e4m3 W8A8.
bool built(int a_dtype, int variant, bool block = false, bool precise = false) {
  if (block) {
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_90
    if (variant == QB_VARIANT_SM90 && a_dtype == QB_E4M3) return true;
#endif
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_89
    if (variant == QB_VARIANT_SM89 && a_dtype == QB_E4M3) return true;
#endif
  } else if (is_w8a16(a_dtype)) {
#ifdef QB_HAS_SCALED_MM_W8A16_90
    if (variant == QB_VARIANT_SM90) return true;
#endif
  } else if (a_dtype == QB_E4M3 && precise) {
#ifdef QB_HAS_SCALED_MM_FP8_PRECISE_90
    if (variant == QB_VARIANT_SM90) return true;
#endif
  } else if (a_dtype == QB_E4M3) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    if (variant == QB_VARIANT_SM90) return true;
#endif
#ifdef QB_HAS_SCALED_MM_FP8_89
    if (variant == QB_VARIANT_SM89) return true;
#endif
  } else if (a_dtype == QB_I8) {
#ifdef QB_HAS_SCALED_MM_INT8_90
    if (variant == QB_VARIANT_SM90) return true;
#endif
#ifdef QB_HAS_SCALED_MM_INT8_80
    if (variant == QB_VARIANT_SM80) return true;
#endif
#ifdef QB_HAS_SCALED_MM_INT8_75
    if (variant == QB_VARIANT_SM75) return true;
#endif
  }
  (void)variant;
  return false;
}

// A variant's kernels run on a device when its SASS or PTX can: sm_90a SASS only on 9.0 exactly,
// the PTX-carrying families on their arch and anything newer.
bool runs_on(int variant, int cc) { return variant == QB_VARIANT_SM90 ? cc == 90 : cc >= variant; }

// AUTO -> the best family compiled for this device; a forced variant is checked, not changed.
int resolve_variant(int a_dtype, bool block, bool precise, int variant, int cc, const qb::Err& err, int* out) {
  precise = precise && a_dtype == QB_E4M3 && !block;
  const char* what = block ? "block-scaled e4m3" : precise ? "precise-accumulation e4m3" : dtype_name(a_dtype);
  if (variant == QB_VARIANT_AUTO) {
    static const int kFp8Order[] = {QB_VARIANT_SM90, QB_VARIANT_SM89};
    static const int kInt8Order[] = {QB_VARIANT_SM90, QB_VARIANT_SM80, QB_VARIANT_SM75};
    static const int kSm90Only[] = {QB_VARIANT_SM90};
    const bool sm90_only = precise || is_w8a16(a_dtype);
    const int* order = sm90_only ? kSm90Only : a_dtype == QB_E4M3 ? kFp8Order : kInt8Order;
    const int count = sm90_only ? 1 : a_dtype == QB_E4M3 ? 2 : 3;
    for (int i = 0; i < count; ++i) {
      if (built(a_dtype, order[i], block, precise) && runs_on(order[i], cc)) {
        *out = order[i];
        return QB_OK;
      }
    }
    return err.set(QB_ERR_UNSUPPORTED,
                   "qb_scaled_mm: no %s kernel in this library runs on compute capability %d.%d "
                   "(fp8 and block-scaled fp8 need 8.9+ with the sm89/sm90 families built, int8 7.5+ with "
                   "sm75/sm80/sm90, w8a16 and precise-accumulation fp8 9.0 with sm90)",
                   what, cc / 10, cc % 10);
  }
  if (variant != QB_VARIANT_SM90 && variant != QB_VARIANT_SM89 && variant != QB_VARIANT_SM80 &&
      variant != QB_VARIANT_SM75)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: unknown variant %d", variant);
  if (!built(a_dtype, variant, block, precise))
    return err.set(QB_ERR_NOT_BUILT, "qb_scaled_mm: variant %d for %s was not compiled into this library", variant,
                   what);
  if (!runs_on(variant, cc))
    return err.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm: variant %d cannot run on compute capability %d.%d", variant,
                   cc / 10, cc % 10);
  *out = variant;
  return QB_OK;
}

size_t family_workspace(int variant, const qb::ScaledMmArgs& a) {
  switch (variant) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    case QB_VARIANT_SM90:
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_90
      if (a.block_scaled) return qb::sm90_fp8_block_workspace(a);
#endif
      if (a.a_dtype == QB_I8 || (a.a_dtype == QB_E4M3 && a.precise)) return qb::sm90_plain_workspace(a);
      return is_w8a16(a.a_dtype) ? qb::sm90_w8a16_workspace(a) : qb::sm90_fp8_workspace(a);
#endif
#ifdef QB_HAS_SCALED_MM_FP8_89
    case QB_VARIANT_SM89:
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_89
      if (a.block_scaled) return qb::sm89_fp8_block_workspace(a);
#endif
      return qb::sm89_fp8_workspace(a);
#endif
#ifdef QB_HAS_SCALED_MM_INT8_80
    case QB_VARIANT_SM80: return qb::sm80_int8_workspace(a);
#endif
#ifdef QB_HAS_SCALED_MM_INT8_75
    case QB_VARIANT_SM75: return qb::sm75_int8_workspace(a);
#endif
    default: (void)a; return 0;
  }
}

int family_run(int variant, const qb::ScaledMmArgs& a, const qb::Err& err) {
  switch (variant) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    case QB_VARIANT_SM90:
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_90
      if (a.block_scaled) return qb::sm90_fp8_block_scaled_mm(a, err);
#endif
      if (a.a_dtype == QB_I8 || (a.a_dtype == QB_E4M3 && a.precise)) return qb::sm90_plain_scaled_mm(a, err);
      return is_w8a16(a.a_dtype) ? qb::sm90_w8a16_scaled_mm(a, err) : qb::sm90_fp8_scaled_mm(a, err);
#endif
#ifdef QB_HAS_SCALED_MM_FP8_89
    case QB_VARIANT_SM89:
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_89
      if (a.block_scaled) return qb::sm89_fp8_block_scaled_mm(a, err);
#endif
      return qb::sm89_fp8_scaled_mm(a, err);
#endif
#ifdef QB_HAS_SCALED_MM_INT8_80
    case QB_VARIANT_SM80: return qb::sm80_int8_scaled_mm(a, err);
#endif
#ifdef QB_HAS_SCALED_MM_INT8_75
    case QB_VARIANT_SM75: return qb::sm75_int8_scaled_mm(a, err);
#endif
    default: (void)a; return err.set(QB_ERR_NOT_BUILT, "qb_scaled_mm: variant %d not built", variant);
  }
}

// Rules on sizes and codes alone (no pointers): shared by the call and the workspace query.
int check_shape(int64_t M, int64_t N, int64_t K, int a_dtype, int b_dtype, int out_dtype, const qb::Err& err,
                bool block = false) {
  if (block && (a_dtype != QB_E4M3 || b_dtype != QB_E4M3))
    return err.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm: block scaling (QB_SCALE_BLOCK) takes e4m3 a and b, not %s x %s",
                   dtype_name(a_dtype), dtype_name(b_dtype));
  if (is_w8a16(a_dtype)) {
    if (b_dtype != QB_E4M3)
      return err.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm: with %s activations (W8A16) b_dtype (%s) must be e4m3",
                     dtype_name(a_dtype), dtype_name(b_dtype));
    if (out_dtype != a_dtype)
      return err.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm: W8A16 writes its output in a's dtype (%s), not %s",
                     dtype_name(a_dtype), dtype_name(out_dtype));
  } else if (a_dtype != QB_E4M3 && a_dtype != QB_I8) {
    if (a_dtype == QB_E5M2)
      return err.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm: e5m2 operands are not supported (e4m3 or i8 only)");
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_scaled_mm: a_dtype %d (%s) must be e4m3 (%d), i8 (%d), or bf16/f16 with an e4m3 b", a_dtype,
                   dtype_name(a_dtype), QB_E4M3, QB_I8);
  }
  if (b_dtype != a_dtype && !is_w8a16(a_dtype))
    return err.set(b_dtype == QB_E5M2 || b_dtype == QB_E4M3 || b_dtype == QB_I8 ? QB_ERR_UNSUPPORTED
                                                                                 : QB_ERR_INVALID_ARGUMENT,
                   "qb_scaled_mm: b_dtype (%s) must equal a_dtype (%s)", dtype_name(b_dtype), dtype_name(a_dtype));
  if (out_dtype != QB_BF16 && out_dtype != QB_F16)
    return err.set(out_dtype == QB_F32 ? QB_ERR_UNSUPPORTED : QB_ERR_INVALID_ARGUMENT,
                   "qb_scaled_mm: out_dtype %s must be bf16 or f16", dtype_name(out_dtype));
  if (M < 0) return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: M (=%lld) must be >= 0", (long long)M);
  if (N <= 0 || K <= 0)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: N (=%lld) and K (=%lld) must be > 0", (long long)N,
                   (long long)K);
  // Kernels index problem sizes with 32-bit ints.
  const int64_t kMax = (int64_t(1) << 31) - 1;
  if (M > kMax || N > kMax || K > kMax)
    return err.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm: M, N and K must each be < 2^31");
  if (K % 16 != 0)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: K (=%lld) must be a multiple of 16", (long long)K);
  // 16-byte output rows of the transposed W8A16 and block-scaled products need N % 8; the other W8A8
  // kernels' tiles need N % 16.
  const int n_align = is_w8a16(a_dtype) || block ? 8 : 16;
  if (N % n_align != 0)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: N (=%lld) must be a multiple of %d", (long long)N,
                   n_align);
  return QB_OK;
}

// The shape, device and tuning part of a call's arguments, and the family that will run it: shared by
// the call itself and by the workspace-size query, which must plan exactly the same launch.
int plan(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldo, int a_dtype, bool block,
         int out_dtype, int variant, const qb::Err& err, qb::ScaledMmArgs* args, int* fam) {
  qb::DeviceInfo dev;
  int st = qb::current_device(&dev, err);
  if (st != QB_OK) return st;
  bool precise;
  variant = split_accumulate(variant, &precise);
  if ((st = resolve_variant(a_dtype, block, precise, variant, dev.cc, err, fam)) != QB_OK) return st;
  *args = qb::ScaledMmArgs{};
  args->block_scaled = block;
  args->precise = precise;
  args->M = M;
  args->N = N;
  args->K = K;
  args->lda = lda;
  args->ldb = ldb;
  args->ldo = ldo;
  args->a_dtype = a_dtype;
  args->out_dtype = out_dtype;
  args->sm_count = dev.sm_count;
  args->config = t_config;
  args->decomp = t_decomp;
  args->splits = t_splits;
  args->swizzle = t_swizzle;
  args->programmatic = qb::programmatic_launch();
  return QB_OK;
}

int scaled_mm_impl(const void* a, int64_t lda, const void* b, int64_t ldb, void* out, int64_t ldo, int64_t M,
                   int64_t N, int64_t K, int a_dtype, int b_dtype, int out_dtype, const float* scale_a,
                   int scale_a_kind, const float* scale_b, int scale_b_kind, const void* bias, int variant,
                   void* workspace, size_t workspace_size, void* stream, const qb::Err& err) {
  if (err.buf && err.len) err.buf[0] = '\0';
  if (scale_a_kind != QB_SCALE_TENSOR && scale_a_kind != QB_SCALE_ROW && scale_a_kind != QB_SCALE_BLOCK)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: scale_a_kind %d must be 0 (tensor), 1 (row) or 2 (block)",
                   scale_a_kind);
  if (scale_b_kind != QB_SCALE_TENSOR && scale_b_kind != QB_SCALE_ROW && scale_b_kind != QB_SCALE_BLOCK)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_scaled_mm: scale_b_kind %d must be 0 (tensor), 1 (column) or 2 (block)", scale_b_kind);
  const bool block = scale_a_kind == QB_SCALE_BLOCK || scale_b_kind == QB_SCALE_BLOCK;
  if (block && scale_a_kind != scale_b_kind)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: block scaling sets both scale kinds to 2 (block), got %d and %d",
                   scale_a_kind, scale_b_kind);
  int st = check_shape(M, N, K, a_dtype, b_dtype, out_dtype, err, block);
  if (st != QB_OK) return st;
  if (M == 0) return QB_OK;  // empty [0, K] tensors may carry NULL data pointers: nothing to read or write

  if (a == nullptr || b == nullptr || out == nullptr || scale_b == nullptr)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: a, b, out and scale_b must be non-NULL");
  if (is_w8a16(a_dtype) ? scale_a != nullptr : scale_a == nullptr)
    return err.set(QB_ERR_INVALID_ARGUMENT, is_w8a16(a_dtype)
                                                ? "qb_scaled_mm: W8A16 (16-bit a) takes no scale_a: pass NULL"
                                                : "qb_scaled_mm: scale_a must be non-NULL");
  if (lda < K || ldb < K || ldo < N)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_scaled_mm: leading dimensions too small: need lda (=%lld) >= K, ldb (=%lld) >= K, "
                   "ldo (=%lld) >= N (K=%lld, N=%lld)",
                   (long long)lda, (long long)ldb, (long long)ldo, (long long)K, (long long)N);
  const int64_t out_size = 2;  // bf16 / f16
  const int64_t a_size = is_w8a16(a_dtype) ? 2 : 1;
  if (!qb::aligned16(a) || !qb::aligned16(b) || !qb::aligned16(out))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: a, b and out must be 16-byte aligned");
  if ((lda * a_size) % 16 != 0 || ldb % 16 != 0 || (ldo * out_size) % 16 != 0)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_scaled_mm: row strides must be multiples of 16 bytes (lda=%lld elements of %lld bytes, "
                   "ldb=%lld elements of 1 byte, ldo=%lld elements of 2 bytes)",
                   (long long)lda, (long long)a_size, (long long)ldb, (long long)ldo);
  if ((reinterpret_cast<uintptr_t>(scale_a) & 3u) || (reinterpret_cast<uintptr_t>(scale_b) & 3u))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: scale_a and scale_b must be 4-byte aligned fp32");
  if (bias != nullptr && (reinterpret_cast<uintptr_t>(bias) & 1u))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm: bias must be 2-byte aligned");

  qb::ScaledMmArgs args;
  int fam = 0;
  if ((st = plan(M, N, K, lda, ldb, ldo, a_dtype, block, out_dtype, variant, err, &args, &fam)) != QB_OK) return st;
  args.a = a;
  args.b = b;
  args.out = out;
  args.scale_a = scale_a;
  args.scale_a_per_row = scale_a_kind == QB_SCALE_ROW;
  args.scale_b = scale_b;
  args.scale_b_per_col = scale_b_kind == QB_SCALE_ROW;
  args.bias = bias;
  args.workspace = workspace;
  args.workspace_size = workspace ? workspace_size : 0;
  args.stream = static_cast<cudaStream_t>(stream);
  return family_run(fam, args, err);
}

// A problem's shape alone, for the questions answered without a GPU (no pointers, no stream).
[[maybe_unused]] qb::ScaledMmArgs shape_only(int64_t M, int64_t N, int64_t K, int sm_count) {
  qb::ScaledMmArgs args{};
  args.M = M;
  args.N = N;
  args.K = K;
  args.sm_count = sm_count;
  return args;
}

}  // namespace

extern "C" int qb_scaled_mm(const void* a, int64_t lda, const void* b, int64_t ldb, void* out, int64_t ldo,
                            int64_t M, int64_t N, int64_t K, int a_dtype, int b_dtype, int out_dtype,
                            const float* scale_a, int scale_a_kind, const float* scale_b, int scale_b_kind,
                            const void* bias, int variant, void* stream, char* err, size_t err_len) {
  return scaled_mm_impl(a, lda, b, ldb, out, ldo, M, N, K, a_dtype, b_dtype, out_dtype, scale_a, scale_a_kind,
                        scale_b, scale_b_kind, bias, variant, nullptr, 0, stream, qb::Err{err, err_len});
}

extern "C" int qb_scaled_mm_ws(const void* a, int64_t lda, const void* b, int64_t ldb, void* out, int64_t ldo,
                               int64_t M, int64_t N, int64_t K, int a_dtype, int b_dtype, int out_dtype,
                               const float* scale_a, int scale_a_kind, const float* scale_b, int scale_b_kind,
                               const void* bias, int variant, void* workspace, size_t workspace_size, void* stream,
                               char* err, size_t err_len) {
  return scaled_mm_impl(a, lda, b, ldb, out, ldo, M, N, K, a_dtype, b_dtype, out_dtype, scale_a, scale_a_kind,
                        scale_b, scale_b_kind, bias, variant, workspace, workspace_size, stream,
                        qb::Err{err, err_len});
}

// The workspace the call with these sizes would plan for (0 for a malformed request or M == 0).
static size_t workspace_for(int64_t M, int64_t N, int64_t K, int a_dtype, bool block, int out_dtype, int variant) {
  const qb::Err none{nullptr, 0};
  const int b_dtype = is_w8a16(a_dtype) ? QB_E4M3 : a_dtype;
  if (check_shape(M, N, K, a_dtype, b_dtype, out_dtype, none, block) != QB_OK || M == 0) return 0;
  qb::ScaledMmArgs args;
  int fam = 0;
  if (plan(M, N, K, K, K, N, a_dtype, block, out_dtype, variant, none, &args, &fam) != QB_OK) return 0;
  return family_workspace(fam, args);
}

extern "C" size_t qb_scaled_mm_workspace_size(int64_t M, int64_t N, int64_t K, int a_dtype, int out_dtype,
                                              int variant) {
  return workspace_for(M, N, K, a_dtype, false, out_dtype, variant);
}

extern "C" size_t qb_scaled_mm_block_workspace_size(int64_t M, int64_t N, int64_t K, int out_dtype, int variant) {
  return workspace_for(M, N, K, QB_E4M3, true, out_dtype, variant);
}

extern "C" int qb_scaled_mm_block_config_count(int variant) {
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_90
  if (variant == QB_VARIANT_SM90) return qb::sm90_fp8_block_config_count();
#endif
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_89
  if (variant == QB_VARIANT_SM89) return qb::sm89_fp8_block_config_count();
#endif
  (void)variant;
  return 0;
}

extern "C" const char* qb_scaled_mm_block_config_name(int variant, int config) {
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_90
  if (variant == QB_VARIANT_SM90) return qb::sm90_fp8_block_config_name(config);
#endif
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_89
  if (variant == QB_VARIANT_SM89) return qb::sm89_fp8_block_config_name(config);
#endif
  (void)variant;
  (void)config;
  return nullptr;
}

extern "C" int qb_scaled_mm_config_count(int a_dtype, int variant) {
  bool precise;
  variant = split_accumulate(variant, &precise);
  if (!built(a_dtype, variant, false, precise)) return 0;
  switch (variant) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    case QB_VARIANT_SM90:
      if (a_dtype == QB_I8 || (a_dtype == QB_E4M3 && precise)) return qb::sm90_plain_config_count();
      return is_w8a16(a_dtype) ? qb::sm90_w8a16_config_count() : qb::sm90_fp8_config_count();
#endif
#ifdef QB_HAS_SCALED_MM_FP8_89
    case QB_VARIANT_SM89: return qb::sm89_fp8_config_count();
#endif
#ifdef QB_HAS_SCALED_MM_INT8_80
    case QB_VARIANT_SM80: return qb::sm80_int8_config_count();
#endif
#ifdef QB_HAS_SCALED_MM_INT8_75
    case QB_VARIANT_SM75: return qb::sm75_int8_config_count();
#endif
    default: return 0;
  }
}

extern "C" const char* qb_scaled_mm_config_name(int a_dtype, int variant, int config) {
  bool precise;
  variant = split_accumulate(variant, &precise);
  if (!built(a_dtype, variant, false, precise) || config < 0) return nullptr;
  switch (variant) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    case QB_VARIANT_SM90:
      if (a_dtype == QB_I8 || (a_dtype == QB_E4M3 && precise)) return qb::sm90_plain_config_name(config);
      return is_w8a16(a_dtype) ? qb::sm90_w8a16_config_name(config) : qb::sm90_fp8_config_name(config);
#endif
#ifdef QB_HAS_SCALED_MM_FP8_89
    case QB_VARIANT_SM89: return qb::sm89_fp8_config_name(config);
#endif
#ifdef QB_HAS_SCALED_MM_INT8_80
    case QB_VARIANT_SM80: return qb::sm80_int8_config_name(config);
#endif
#ifdef QB_HAS_SCALED_MM_INT8_75
    case QB_VARIANT_SM75: return qb::sm75_int8_config_name(config);
#endif
    default: return nullptr;
  }
}

extern "C" int qb_scaled_mm_auto_config(int64_t M, int64_t N, int64_t K, int a_dtype, int variant, int sm_count,
                                        int* config, int* decomposition, int* splits, int* swizzle, char* err,
                                        size_t err_len) {
  const qb::Err e{err, err_len};
  if (err && err_len) err[0] = '\0';
  int st = check_shape(M, N, K, a_dtype, a_dtype, QB_BF16, e);
  if (st != QB_OK) return st;
  if (M < 1) return e.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm_auto_config: M (=%lld) must be >= 1", (long long)M);
  if (sm_count < 1)
    return e.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm_auto_config: sm_count (=%d) must be >= 1", sm_count);
  if (!config || !decomposition || !splits || !swizzle)
    return e.set(QB_ERR_INVALID_ARGUMENT, "qb_scaled_mm_auto_config: every output pointer must be non-NULL");
  if (!built(a_dtype, variant))
    return e.set(QB_ERR_NOT_BUILT, "qb_scaled_mm_auto_config: variant %d is not built for %s", variant,
                 dtype_name(a_dtype));
  if (a_dtype != QB_E4M3)
    return e.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm_auto_config: only the sm90 FP8 family (variant 90) says its choice");
  switch (variant) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    case QB_VARIANT_SM90:
      *config = qb::sm90_fp8_auto_config(shape_only(M, N, K, sm_count), decomposition, splits, swizzle);
      return QB_OK;
#endif
    default:
      return e.set(QB_ERR_UNSUPPORTED, "qb_scaled_mm_auto_config: only the sm90 FP8 family (variant 90) says its choice");
  }
}

extern "C" int64_t qb_scaled_mm_token_rows(int64_t M, int64_t N, int64_t K, int a_dtype, int variant, int sm_count,
                                           int64_t rows_available) {
  if (M < 1 || a_dtype != QB_E4M3 || !built(a_dtype, variant)) return M;  // whole token tiles: FP8 only
  if (N != 0 && (rows_available <= M || check_shape(M, N, K, a_dtype, a_dtype, QB_BF16, qb::Err{nullptr, 0}) != QB_OK))
    return M;
  switch (variant) {
#ifdef QB_HAS_SCALED_MM_FP8_90
    case QB_VARIANT_SM90:
      return qb::sm90_fp8_token_rows(shape_only(M, N, K, sm_count), rows_available);
#endif
    default:
      return M;
  }
}

extern "C" void qb_scaled_mm_override(int config, int decomposition, int splits, int swizzle) {
  t_config = config;
  t_decomp = decomposition;
  t_splits = splits;
  t_swizzle = swizzle;
}
