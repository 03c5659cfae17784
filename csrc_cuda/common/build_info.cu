// build_info.cu: qb_build_info and qb_has_variant, answered from what CMake compiled in.
//
// CMake defines QB_ARCHS_STRING (e.g. "sm_89 sm_90a compute_89") and one QB_HAS_<OP>_<VARIANT>
// per kernel family it compiled (qb_declare_variant() in CMakeLists.txt), so the answers are
// facts about this binary, not about the source tree.
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cutlass/version.h>

#include "qb_common.h"

#ifndef QB_ARCHS_STRING
#define QB_ARCHS_STRING ""
#endif

namespace {

struct Variant {
  const char* op;
  int variant;
};

const Variant kVariants[] = {
#ifdef QB_HAS_SCALED_MM_FP8_90
    {"scaled_mm_fp8", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_SCALED_MM_FP8_89
    {"scaled_mm_fp8", QB_VARIANT_SM89},
#endif
#ifdef QB_HAS_SCALED_MM_W8A16_90
    {"scaled_mm_w8a16", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_90
    {"scaled_mm_fp8_block", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_SCALED_MM_FP8_BLOCK_89
    {"scaled_mm_fp8_block", QB_VARIANT_SM89},
#endif
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_90
    {"grouped_scaled_mm_fp8", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_GROUPED_SCALED_MM_FP8_89
    {"grouped_scaled_mm_fp8", QB_VARIANT_SM89},
#endif
#ifdef QB_HAS_SCALED_MM_FP8_PRECISE_90
    {"scaled_mm_fp8_precise", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_SCALED_MM_INT8_90
    {"scaled_mm_int8", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_SCALED_MM_INT8_89
    {"scaled_mm_int8", QB_VARIANT_SM89},
#endif
#ifdef QB_HAS_SCALED_MM_INT8_80
    {"scaled_mm_int8", QB_VARIANT_SM80},
#endif
#ifdef QB_HAS_SCALED_MM_INT8_75
    {"scaled_mm_int8", QB_VARIANT_SM75},
#endif
#ifdef QB_HAS_MARLIN_90
    {"marlin", QB_VARIANT_SM90},
#endif
#ifdef QB_HAS_MARLIN_89
    {"marlin", QB_VARIANT_SM89},
#endif
#ifdef QB_HAS_MARLIN_80
    {"marlin", QB_VARIANT_SM80},
#endif
#ifdef QB_HAS_MARLIN_75
    {"marlin", QB_VARIANT_SM75},
#endif
    {"quantize", QB_VARIANT_AUTO},  // quantize kernels are compiled for every configured arch
    {"quantize_group", QB_VARIANT_AUTO},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

const char* kOps[] = {"scaled_mm_fp8",  "scaled_mm_fp8_precise", "scaled_mm_fp8_block",   "scaled_mm_int8",
                      "scaled_mm_w8a16", "grouped_scaled_mm_fp8", "quantize", "quantize_group", "marlin"};

// Appends to buf at *pos, never past buf_len - 1; keeps the string NUL-terminated.
void put(char* buf, size_t buf_len, size_t* pos, const char* s) {
  while (*s && *pos + 1 < buf_len) buf[(*pos)++] = *s++;
  if (*pos < buf_len) buf[*pos] = '\0';
}

}  // namespace

extern "C" int qb_has_variant(const char* op, int variant) {
  if (op == nullptr) return 0;
  for (int i = 0; i < kNumVariants; ++i) {
    if (strcmp(op, kVariants[i].op) != 0) continue;
    // AUTO is available for an op as soon as any variant of it is.
    if (variant == QB_VARIANT_AUTO || variant == kVariants[i].variant) return 1;
  }
  return 0;
}

extern "C" int qb_build_info(char* buf, size_t buf_len) {
  if (buf == nullptr || buf_len == 0) return QB_ERR_INVALID_ARGUMENT;
  size_t pos = 0;
  buf[0] = '\0';
  char line[160];
  snprintf(line, sizeof line, "abi=%d\n", QB_ABI_VERSION);
  put(buf, buf_len, &pos, line);
  put(buf, buf_len, &pos, "archs=" QB_ARCHS_STRING "\n");
  for (const char* op : kOps) {
    snprintf(line, sizeof line, "variants.%s=", op);
    put(buf, buf_len, &pos, line);
    bool first = true;
    for (int i = 0; i < kNumVariants; ++i) {
      if (strcmp(op, kVariants[i].op) != 0) continue;
      snprintf(line, sizeof line, first ? "%d" : " %d", kVariants[i].variant);
      put(buf, buf_len, &pos, line);
      first = false;
    }
    put(buf, buf_len, &pos, "\n");
  }
  snprintf(line, sizeof line, "cuda_runtime=%d\ncutlass=%d.%d.%d\n", CUDART_VERSION, CUTLASS_MAJOR, CUTLASS_MINOR,
           CUTLASS_PATCH);
  put(buf, buf_len, &pos, line);
  return QB_OK;
}
