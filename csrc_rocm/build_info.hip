// build_info.hip: qb_build_info and qb_has_variant, what the loader and `qbackend info` read.
#include <stdio.h>
#include <string.h>

#include "rocm_compat.h"
#include "qbackend_rocm.h"

// The gfx targets this library was compiled for: the build passes them as comma-separated tokens
// (-DQB_ROCM_ARCHS=gfx942,gfx950), which become the string "gfx942,gfx950".
#define QB_STRINGIFY(...) #__VA_ARGS__
#define QB_EXPAND_STRINGIFY(...) QB_STRINGIFY(__VA_ARGS__)
#if defined(QB_ROCM_ARCHS)
#define QB_ARCHS QB_EXPAND_STRINGIFY(QB_ROCM_ARCHS)
#elif defined(__HIP_CPU_RT__)
#define QB_ARCHS "cpu"
#else
#define QB_ARCHS "unknown"
#endif

#if defined(HIP_VERSION)
#define QB_HIP_VERSION HIP_VERSION
#else
#define QB_HIP_VERSION 0
#endif

extern "C" int qb_build_info(char* buf, size_t buf_len) {
  if (buf == nullptr || buf_len == 0) return QB_OK;
  snprintf(buf, buf_len,
           "abi=%d\narchs=%s\nhip_version=%d\nvariants.quantize=0\nvariants.quantize_group=0\n",
           QB_ROCM_ABI_VERSION, QB_ARCHS, QB_HIP_VERSION);
  return QB_OK;
}

extern "C" int qb_has_variant(const char* op, int variant) {
  if (op == nullptr || variant != 0) return 0;
  return strcmp(op, "quantize") == 0 || strcmp(op, "quantize_group") == 0;
}
