// grouped_scaled_mm.cu: qb_grouped_scaled_mm's argument checks and the choice of kernel family.
//
// As in scaled_mm.cu, everything that could make a kernel fault is checked here (sizes, strides,
// alignment, pointers); `offsets` alone is data that is never read on the host, and the kernels
// clamp it (see qbackend_cuda.h).
#include <stdio.h>

#include "grouped.h"

namespace {

thread_local int t_grouped_config = -1;  // qb_grouped_scaled_mm_override

using qb::kMaxGroups;

bool built(int variant) {
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_90
  if (variant == QB_VARIANT_SM90) return true;
#endif
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_89
  if (variant == QB_VARIANT_SM89) return true;
#endif
  (void)variant;
  return false;
}

// The sm90 family runs where its sm_90a code does (compute capability 9.0 exactly); with the
// workspace it needs it is the automatic choice there.
bool sm90_takes(int cc) { return built(QB_VARIANT_SM90) && cc == 90; }

size_t sm90_workspace(const qb::GroupedArgs& args, int sm_count) {
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_90
  return qb::sm90_fp8_grouped_workspace(args, sm_count);
#else
  (void)args;
  (void)sm_count;
  return 0;
#endif
}

// AUTO -> sm90 where it takes the request and has its workspace, else the sm89 family where it is
// built and the device runs its SASS or PTX (8.9 and newer).
int resolve_variant(int variant, const qb::GroupedArgs& args, int cc, int sm_count, const qb::Err& err, int* out) {
  if (variant != QB_VARIANT_AUTO && variant != QB_VARIANT_SM89 && variant != QB_VARIANT_SM90)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_grouped_scaled_mm: variant %d must be 0 (auto), 89 or 90", variant);
  if (variant == QB_VARIANT_SM90 ||
      (variant == QB_VARIANT_AUTO && sm90_takes(cc) && args.workspace != nullptr &&
       args.workspace_size >= sm90_workspace(args, sm_count))) {
    if (!built(QB_VARIANT_SM90))
      return err.set(QB_ERR_NOT_BUILT, "qb_grouped_scaled_mm: the sm90 family was not compiled into this library");
    if (cc != 90)
      return err.set(QB_ERR_UNSUPPORTED, "qb_grouped_scaled_mm: the sm90 family needs compute capability 9.0, "
                     "this device is %d.%d", cc / 10, cc % 10);
    *out = QB_VARIANT_SM90;
    return QB_OK;
  }
  if (!built(QB_VARIANT_SM89))
    return err.set(QB_ERR_NOT_BUILT, "qb_grouped_scaled_mm: the sm89 family was not compiled into this library");
  if (cc < 89)
    return err.set(QB_ERR_UNSUPPORTED,
                   "qb_grouped_scaled_mm: e4m3 tensor cores need compute capability 8.9+, this device is %d.%d",
                   cc / 10, cc % 10);
  *out = QB_VARIANT_SM89;
  return QB_OK;
}

bool misaligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) != 0; }

int check(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t ldb_group, void* out, int64_t ldo,
          const int32_t* offsets, int64_t M, int64_t N, int64_t K, int64_t groups, int a_dtype, int b_dtype,
          int out_dtype, const float* scale_a, int scale_a_kind, const float* scale_b, int scale_b_kind,
          const void* bias, const qb::Err& err) {
  if (a_dtype != QB_E4M3 || b_dtype != QB_E4M3)
    return err.set(a_dtype == QB_E5M2 || a_dtype == QB_I8 || b_dtype == QB_E5M2 || b_dtype == QB_I8
                       ? QB_ERR_UNSUPPORTED
                       : QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: a_dtype and b_dtype must be e4m3 (%d), got %d and %d", QB_E4M3, a_dtype,
                   b_dtype);
  if (out_dtype != QB_BF16 && out_dtype != QB_F16)
    return err.set(out_dtype == QB_F32 ? QB_ERR_UNSUPPORTED : QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: out_dtype %d must be bf16 (%d) or f16 (%d)", out_dtype, QB_BF16, QB_F16);
  const bool block = scale_a_kind == QB_SCALE_BLOCK || scale_b_kind == QB_SCALE_BLOCK;
  if (block ? scale_a_kind != scale_b_kind
            : (scale_a_kind != QB_SCALE_TENSOR && scale_a_kind != QB_SCALE_ROW) ||
                  (scale_b_kind != QB_SCALE_TENSOR && scale_b_kind != QB_SCALE_ROW))
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: scale kinds must be tensor (0) or row (1) each, or both block (2); got "
                   "%d and %d",
                   scale_a_kind, scale_b_kind);
  if (groups < 1 || groups > kMaxGroups)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_grouped_scaled_mm: groups (=%lld) must be 1 to %lld",
                   (long long)groups, (long long)kMaxGroups);
  const int64_t kMax = (int64_t(1) << 31) - 1;
  if (M < 0 || N <= 0 || K <= 0 || M > kMax || N > kMax || K > kMax)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_grouped_scaled_mm: need 0 <= M < 2^31 and 0 < N, K < 2^31 "
                   "(M=%lld, N=%lld, K=%lld)", (long long)M, (long long)N, (long long)K);
  if (K % 16 != 0 || N % 8 != 0)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: K (=%lld) must be a multiple of 16 and N (=%lld) of 8", (long long)K,
                   (long long)N);
  if (M == 0) return QB_OK;
  if (!a || !b || !out || !offsets || !scale_a || !scale_b)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: a, b, out, offsets, scale_a and scale_b must be non-NULL");
  if (lda < K || ldb < K || ldo < N || ldb_group < 0)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: strides out of range: need lda (=%lld) >= K, ldb (=%lld) >= K, "
                   "ldb_group (=%lld) >= 0, ldo (=%lld) >= N (K=%lld, N=%lld)",
                   (long long)lda, (long long)ldb, (long long)ldb_group, (long long)ldo, (long long)K, (long long)N);
  if (misaligned(a, 16) || misaligned(b, 16) || misaligned(out, 16) || lda % 16 || ldb % 16 || ldb_group % 16 ||
      (ldo * 2) % 16)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: a, b and out must be 16-byte aligned, and lda, ldb, ldb_group (bytes) and "
                   "ldo (2-byte elements) multiples of 16 bytes");
  if (misaligned(scale_a, 4) || misaligned(scale_b, 4) || misaligned(offsets, 4) || misaligned(bias, 2))
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "qb_grouped_scaled_mm: scales and offsets must be 4-byte aligned, bias 2-byte aligned");
  return QB_OK;
}

qb::GroupedArgs make_args(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t ldb_group, void* out,
                          int64_t ldo, const int32_t* offsets, int64_t M, int64_t N, int64_t K, int64_t groups,
                          int out_dtype, const float* scale_a, int scale_a_kind, const float* scale_b,
                          int scale_b_kind, const void* bias, void* workspace, size_t workspace_size, void* stream) {
  qb::GroupedArgs args{};
  args.a = a;
  args.lda = lda;
  args.b = b;
  args.ldb = ldb;
  args.ldb_group = ldb_group;
  args.out = out;
  args.ldo = ldo;
  args.offsets = offsets;
  args.M = M;
  args.N = N;
  args.K = K;
  args.groups = groups;
  args.out_dtype = out_dtype;
  args.block_scaled = scale_a_kind == QB_SCALE_BLOCK;
  args.scale_a = scale_a;
  args.scale_a_per_row = scale_a_kind == QB_SCALE_ROW;
  args.scale_b = scale_b;
  args.scale_b_per_col = scale_b_kind == QB_SCALE_ROW;
  args.bias = bias;
  args.workspace = workspace;
  args.workspace_size = workspace ? workspace_size : 0;
  args.stream = static_cast<cudaStream_t>(stream);
  args.config = t_grouped_config;
  return args;
}

int run(const qb::GroupedArgs& args, int family, int sm_count, const qb::Err& e) {
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_90
  if (family == QB_VARIANT_SM90) return qb::sm90_fp8_grouped_scaled_mm(args, sm_count, e);
#endif
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_89
  if (family == QB_VARIANT_SM89) return qb::sm89_fp8_grouped_scaled_mm(args, e);
#endif
  (void)args;
  (void)sm_count;
  return e.set(QB_ERR_NOT_BUILT, "qb_grouped_scaled_mm: family %d is not in this library", family);
}

}  // namespace

extern "C" int qb_grouped_scaled_mm_ws(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t ldb_group,
                                       void* out, int64_t ldo, const int32_t* offsets, int64_t M, int64_t N,
                                       int64_t K, int64_t groups, int a_dtype, int b_dtype, int out_dtype,
                                       const float* scale_a, int scale_a_kind, const float* scale_b,
                                       int scale_b_kind, const void* bias, int variant, void* workspace,
                                       size_t workspace_size, void* stream, char* err, size_t err_len) {
  const qb::Err e{err, err_len};
  if (err && err_len) err[0] = '\0';
  int st = check(a, lda, b, ldb, ldb_group, out, ldo, offsets, M, N, K, groups, a_dtype, b_dtype, out_dtype, scale_a,
                 scale_a_kind, scale_b, scale_b_kind, bias, e);
  if (st != QB_OK || M == 0) return st;
  if (workspace && (reinterpret_cast<uintptr_t>(workspace) & 255))
    return e.set(QB_ERR_INVALID_ARGUMENT, "qb_grouped_scaled_mm: workspace must be 256-byte aligned");
  qb::DeviceInfo dev;
  if ((st = qb::current_device(&dev, e)) != QB_OK) return st;
  const qb::GroupedArgs args = make_args(a, lda, b, ldb, ldb_group, out, ldo, offsets, M, N, K, groups, out_dtype,
                                         scale_a, scale_a_kind, scale_b, scale_b_kind, bias, workspace,
                                         workspace_size, stream);
  int family = 0;
  if ((st = resolve_variant(variant, args, dev.cc, dev.sm_count, e, &family)) != QB_OK) return st;
  return run(args, family, dev.sm_count, e);
}

extern "C" int qb_grouped_scaled_mm(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t ldb_group,
                                    void* out, int64_t ldo, const int32_t* offsets, int64_t M, int64_t N, int64_t K,
                                    int64_t groups, int a_dtype, int b_dtype, int out_dtype, const float* scale_a,
                                    int scale_a_kind, const float* scale_b, int scale_b_kind, const void* bias,
                                    int variant, void* stream, char* err, size_t err_len) {
  return qb_grouped_scaled_mm_ws(a, lda, b, ldb, ldb_group, out, ldo, offsets, M, N, K, groups, a_dtype, b_dtype,
                                 out_dtype, scale_a, scale_a_kind, scale_b, scale_b_kind, bias, variant, nullptr, 0,
                                 stream, err, err_len);
}

extern "C" size_t qb_grouped_scaled_mm_workspace_size(int64_t M, int64_t N, int64_t K, int64_t groups,
                                                      int out_dtype, int scale_kind, int has_bias, int variant) {
  if (M <= 0 || N <= 0 || K <= 0 || groups < 1 || groups > kMaxGroups) return 0;
  if (variant != QB_VARIANT_AUTO && variant != QB_VARIANT_SM90) return 0;
  qb::DeviceInfo dev;
  char sink[8];
  if (qb::current_device(&dev, qb::Err{sink, sizeof(sink)}) != QB_OK) return 0;
  const qb::GroupedArgs args =
      make_args(nullptr, K, nullptr, K, 0, nullptr, N, nullptr, M, N, K, groups, out_dtype, nullptr, scale_kind,
                nullptr, scale_kind, has_bias ? reinterpret_cast<const void*>(1) : nullptr, nullptr, 0, nullptr);
  return sm90_takes(dev.cc) ? sm90_workspace(args, dev.sm_count) : 0;
}

extern "C" int qb_grouped_scaled_mm_config_count(int variant) {
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_90
  if (variant == QB_VARIANT_SM90) return qb::sm90_fp8_grouped_config_count();
#endif
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_89
  if (variant == QB_VARIANT_SM89) return qb::sm89_fp8_grouped_config_count();
#endif
  (void)variant;
  return 0;
}

extern "C" const char* qb_grouped_scaled_mm_config_name(int variant, int config) {
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_90
  if (variant == QB_VARIANT_SM90) return qb::sm90_fp8_grouped_config_name(config);
#endif
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_89
  if (variant == QB_VARIANT_SM89) return qb::sm89_fp8_grouped_config_name(config);
#endif
  (void)variant;
  (void)config;
  return nullptr;
}

extern "C" void qb_grouped_scaled_mm_override(int config) { t_grouped_config = config; }
