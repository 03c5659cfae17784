// w8a16_sm90_kernel.cuh: the CUTLASS 3.x kernel template behind the SM90 W8A16 configs.
//
// W8A16: e4m3 weights, bf16/fp16 activations, fp32 accumulation, output in the activation dtype:
//     out[M, N] = scale_b * (a @ w^T) + bias
// The weight goes through the register file (WGMMA's A operand may come from registers, where each
// e4m3 value is converted to the activation dtype exactly: every e4m3 value is a bf16 and an fp16
// value) and the activations through shared memory. That puts the weight on the GEMM's A side, so
// the product is always computed transposed, D^T[N, M] = W[N, K] . A[M, K]^T, and D^T column-major
// is the row-major out[M, N]: the tokens sit on the tile's N side, where WGMMA takes 8 to 256.
// Both operands are K-major: the weight is the checkpoint's own [N, K] row-major tensor, read in
// place (no repacking at load time).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler_params.h>
#include <cutlass/util/packed_stride.hpp>

#include "cutlass_launch.cuh"  // EarlyTriggerKernel, RunOpts, Decomp
#include "w8a16_sm90_configs.h"

namespace qb::sm90 {

using namespace cute;

template <class ActT_, class TileShape_, class ClusterShape_, class KernelSchedule_, class EpilogueSchedule_,
          class TileScheduler_>
struct W8A16Gemm {
  using ActT = ActT_;
  using TileShape = TileShape_;
  static constexpr bool kStreamK = std::is_same_v<TileScheduler_, cutlass::gemm::StreamKScheduler>;

  using E4M3 = cutlass::float_e4m3_t;
  using LayoutW = cutlass::layout::RowMajor;     // GEMM A: the weight [N, K]
  using LayoutX = cutlass::layout::ColumnMajor;  // GEMM B: the activations [M, K] as a K x M column-major
  using LayoutD = cutlass::layout::ColumnMajor;  // D^T [N, M] column-major == out [M, N] row-major
  static constexpr int kAlignW = 16;             // 16 bytes of e4m3
  static constexpr int kAlignX = 8;              // 16 bytes of bf16/fp16
  static constexpr int kAlignD = 8;

  // Per-channel values run along the GEMM rows: one value per row ("column broadcast").
  using Scale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<bool, _0, _0>>;
  using Bias = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, ActT, float, Stride<_1, _0, _0>>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiply_add, ActT, float, kRound>, Scale,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape_,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD, ActT, LayoutD, kAlignD, EpilogueSchedule_, Fusion>::CollectiveOp;

  // Different A and B types select CUTLASS's mixed-input mainloop (register-sourced A, converted
  // before each WGMMA); with no scale type attached, the conversion is all it does.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, LayoutW, kAlignW, ActT, LayoutX, kAlignX,
      float, TileShape, ClusterShape_,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;

  using Kernel = EarlyTriggerKernel<
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileScheduler_>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments make_args(const ScaledMmArgs& p, const RunOpts& o) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {static_cast<int>(p.N), static_cast<int>(p.M), static_cast<int>(p.K), 1};
    args.mainloop.ptr_A = static_cast<const E4M3*>(p.b);
    args.mainloop.dA = StrideA{p.ldb, _1{}, int64_t(0)};
    args.mainloop.ptr_B = static_cast<const ActT*>(p.a);
    args.mainloop.dB = StrideB{p.lda, _1{}, int64_t(0)};
    const StrideD dD{_1{}, p.ldo, int64_t(0)};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = dD;
    args.epilogue.ptr_D = static_cast<ActT*>(p.out);
    args.epilogue.dD = dD;

    // Visitor tree arguments, children before their node: {Scale, Acc, Bias, op}.
    typename Scale::Arguments sb{};
    sb.ptr_col = p.scale_b;
    sb.dCol = {p.scale_b_per_col, _0{}, _0{}};
    typename Bias::Arguments bi{};
    bi.ptr_col = static_cast<const ActT*>(p.bias);  // null reads as zeros
    args.epilogue.thread = {sb, {}, bi, {}};

    args.hw_info.device_id = 0;
    args.hw_info.sm_count = p.sm_count;
    set_schedule<kStreamK>(args.scheduler, o);
    return args;
  }

  static size_t workspace(const ScaledMmArgs& p, const RunOpts& o) {
    return Gemm::get_workspace_size(make_args(p, o));
  }

  static int run(const ScaledMmArgs& p, const RunOpts& o, const Err& err, const char* name) {
    return launch_gemm<Gemm>(make_args(p, o), p, o.programmatic, err, "w8a16", name);
  }
};

struct MixedCoop {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epi = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Sched = cutlass::gemm::StreamKScheduler;
};
struct MixedPing {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
  using Sched = cutlass::gemm::PersistentScheduler;
};

template <int Id, int ActTag>
struct W8A16ConfigType;
#define QB_W8A16_TYPE(id, name, tm, tn, tk, cm, cn, sched)                                                  \
  template <int ActTag>                                                                                   \
  struct W8A16ConfigType<id, ActTag> {                                                                    \
    using ActT = std::conditional_t<ActTag == 0, cutlass::bfloat16_t, cutlass::half_t>;                  \
    using type = W8A16Gemm<ActT, Shape<Int<tm>, Int<tn>, Int<tk>>, Shape<Int<cm>, Int<cn>, _1>, sched::Kernel, \
                           sched::Epi, sched::Sched>;                                                     \
  };
QB_SM90_W8A16_CONFIGS(QB_W8A16_TYPE)
#undef QB_W8A16_TYPE

template <int Id, int ActTag>
int w8a16_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err) {
  return W8A16ConfigType<Id, ActTag>::type::run(args, opts, err, kW8A16Configs[Id].name);
}
template <int Id, int ActTag>
size_t w8a16_config_workspace(const ScaledMmArgs& args, const RunOpts& opts) {
  return W8A16ConfigType<Id, ActTag>::type::workspace(args, opts);
}

#define QB_SM90_W8A16_INSTANTIATE(id, tag)                                                      \
  template int w8a16_run_config<id, tag>(const ScaledMmArgs&, const RunOpts&, const Err&); \
  template size_t w8a16_config_workspace<id, tag>(const ScaledMmArgs&, const RunOpts&);

}  // namespace qb::sm90
