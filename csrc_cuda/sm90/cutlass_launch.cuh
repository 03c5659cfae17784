// cutlass_launch.cuh: what every SM90 CUTLASS 3.x kernel family does the same way around its GEMM:
// the early trigger of the next kernel (programmatic dependent launch), the tile scheduler's work
// decomposition, and the checked can_implement -> workspace -> initialize -> run sequence that
// reports each failure through Err instead of throwing.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/tile_scheduler_params.h>

#include "fp8_sm90_configs.h"

// Programmatic launches (below) are safe only if CUTLASS's producers wait for the previous grid.
#ifndef CUTLASS_GDC_ENABLED
#error "the sm90 family must be compiled with -DCUTLASS_GDC_ENABLED (see CMakeLists.txt)"
#endif

namespace qb::sm90 {

// Programmatic dependent launch (PDL). Every CTA first signals that the next kernel in the stream
// may start: when that kernel is launched as a programmatic dependent, its CTAs take the SMs this grid
// leaves idle (or frees) and run their prologue (barrier set-up, TMA descriptor prefetch) early. The
// CUTLASS kernels wait for the previous grid to finish (griddepcontrol.wait, compiled in by
// CUTLASS_GDC_ENABLED) before their first global memory access, so no data is read or written early.
// An ordinary launch ignores both instructions.
template <class Base>
struct EarlyTriggerKernel : Base {
  CUTLASS_DEVICE void operator()(typename Base::Params const& params, char* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    Base::operator()(params, smem);
  }
};

// Tile swizzle for every scheduler; for the stream-K scheduler also the decomposition chosen by the
// dispatcher. Partial tiles are summed in a fixed order (deterministic), so results do not vary run
// to run.
template <bool kStreamK, class SchedulerArgs>
void set_schedule(SchedulerArgs& s, const RunOpts& o) {
  s.max_swizzle_size = o.swizzle;
  if constexpr (kStreamK) {
    using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
    s.reduction_mode = cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
    s.splits = 1;
    switch (o.decomp) {
      case Decomp::DataParallel: s.decomposition_mode = Mode::DataParallel; break;
      case Decomp::SplitK: s.decomposition_mode = Mode::SplitK; s.splits = o.splits; break;
      case Decomp::StreamK: s.decomposition_mode = Mode::StreamK; break;
      case Decomp::Heuristic: s.decomposition_mode = Mode::Heuristic; break;
    }
  }
}

// Where and how a CUTLASS GEMM runs: its stream, the caller's workspace, and whether it may start
// as a programmatic dependent of the previous kernel.
struct GemmLaunch {
  cudaStream_t stream;
  void* workspace;
  size_t workspace_size;
  bool programmatic;
};

// Runs one CUTLASS GEMM; `family`, `name` and M, N, K only label error messages.
template <class Gemm>
int launch_gemm(const typename Gemm::Arguments& args, const GemmLaunch& at, const Err& err, const char* family,
                const char* name, int64_t M, int64_t N, int64_t K) {
  cutlass::Status st = Gemm::can_implement(args);
  if (st != cutlass::Status::kSuccess)
    return err.set(QB_ERR_UNSUPPORTED, "sm90 %s config %s cannot implement M=%lld N=%lld K=%lld: %s", family, name,
                   (long long)M, (long long)N, (long long)K, cutlass::cutlassGetStatusString(st));
  const size_t ws = Gemm::get_workspace_size(args);
  if (ws > 0 && (at.workspace == nullptr || at.workspace_size < ws))
    return err.set(QB_ERR_INVALID_ARGUMENT, "sm90 %s config %s needs %zu bytes of workspace, got %zu", family, name,
                   ws, at.workspace ? at.workspace_size : size_t(0));
  Gemm gemm;
  st = gemm.initialize(args, ws ? at.workspace : nullptr, at.stream);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    return err.set(QB_ERR_CUDA, "sm90 %s config %s: CUTLASS initialize failed: %s (CUDA: %s)", family, name,
                   cutlass::cutlassGetStatusString(st), cudaGetErrorString(e));
  }
  st = gemm.run(at.stream, /*cuda_adapter=*/nullptr, at.programmatic);
  cudaError_t e = cudaGetLastError();
  if (st != cutlass::Status::kSuccess || e != cudaSuccess)
    return err.set(QB_ERR_CUDA, "sm90 %s config %s: kernel launch failed: %s (CUDA: %s)", family, name,
                   cutlass::cutlassGetStatusString(st), cudaGetErrorString(e));
  return QB_OK;
}

// One scaled_mm's GEMM on p.stream with p's workspace.
template <class Gemm>
int launch_gemm(const typename Gemm::Arguments& args, const ScaledMmArgs& p, bool programmatic, const Err& err,
                const char* family, const char* name) {
  return launch_gemm<Gemm>(args, GemmLaunch{p.stream, p.workspace, p.workspace_size, programmatic}, err, family,
                           name, p.M, p.N, p.K);
}

}  // namespace qb::sm90
