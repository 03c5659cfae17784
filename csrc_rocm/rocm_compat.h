// rocm_compat.h: what the kernel sources need from HIP, the same on a ROCm GPU and under HIP-CPU.
//
// The sources compile three ways: with hipcc for the library, with a Debian clang and Debian's HIP
// headers for the code-object check in CI, and with g++ against AMD's header-only HIP-CPU runtime
// (__HIP_CPU_RT__), which runs the kernels on the CPU for the bit-exactness tests. Only HIP calls
// all three know are used: hipLaunchKernelGGL, __shfl_xor, __syncthreads, atomicMax on unsigned,
// hipMemsetAsync, hipGetLastError.
#pragma once

#include <hip/hip_runtime.h>

// Helper functions of the kernels. HIP-CPU defines __device__ as GCC's `simd` attribute (it asks for
// vector clones of the function), which these small inlined helpers do not want.
#if defined(__HIP_CPU_RT__)
#define QB_DEV inline
#else
#define QB_DEV __device__ __forceinline__
#endif

// Every target of this library (gfx942, gfx950: CDNA) runs 64-lane wavefronts; the reductions and
// block shapes are written for that.
namespace qbr {
constexpr int kWave = 64;
}
