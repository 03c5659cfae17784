// w8a8_sm90_kernel.cuh: the one CUTLASS 3.x kernel template behind every SM90 FP8 and INT8 config.
//
// A TMA warp-specialized GEMM (WGMMA: e4m3 with FP8 fast accumulation, e4m3 promoted into fp32
// registers after every K tile, or s8 into exact int32) whose epilogue visitor tree computes
//     D = scale_a * (scale_b * acc) + bias
// with scale_a broadcast along the token dimension, scale_b and bias along the channel dimension.
// Scales are "dynamic broadcasts" (a runtime bool stride): one instantiation serves both per-tensor
// and per-row/column scales. A null bias reads as zeros, so bias on/off is also one instantiation.
//
// kSwap computes the transposed product D^T[N, M] = W[N, K] . A[M, K]^T, so that a small M sits on
// the tile's narrow N side (WGMMA's M side is at least 64 rows). D^T column-major is exactly the
// row-major out[M, N], so nothing is transposed in memory.
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

#include "cutlass_launch.cuh"
#include "fp8_sm90_configs.h"
#include "plain_sm90_configs.h"

namespace qb::sm90 {

using namespace cute;

// ElementAB: cutlass::float_e4m3_t or int8_t, for both operands.
template <class ElementAB_, class OutT_, class TileShape_, class ClusterShape_, class KernelSchedule_,
          class EpilogueSchedule_, class TileScheduler_, bool kSwap_>
struct W8A8Gemm {
  using ElementAB = ElementAB_;
  static constexpr bool kInt8 = std::is_same_v<ElementAB, int8_t>;
  // int8 products summed in int32 are exact (K * 127^2 < 2^31 up to K = 133,144); the epilogue
  // converts the sum to fp32 once, before the scales.
  using ElementAcc = std::conditional_t<kInt8, int32_t, float>;
  using OutT = OutT_;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  static constexpr bool kSwap = kSwap_;
  static constexpr bool kStreamK = std::is_same_v<TileScheduler_, cutlass::gemm::StreamKScheduler>;

  // Both operands K-major (TN GEMM), the only 8-bit WGMMA layout with no transposition in smem.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;                    // 16 bytes of 8-bit values per TMA row chunk
  static constexpr int kAlignD = 16 / sizeof(OutT);

  // Broadcast along GEMM rows ("column vector", one value per row) and along GEMM columns.
  // The bool stride selects vector (true) or scalar (false) at run time.
  using RowVec = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<bool, _0, _0>>;
  using ColVec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, bool, _0>>;
  using RowBias = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, OutT, float, Stride<_1, _0, _0>>;
  using ColBias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, OutT, float, Stride<_0, _1, _0>>;

  // Unswapped: GEMM rows are tokens (scale_a), columns are channels (scale_b, bias). Swapped: reverse.
  using ScaleA = std::conditional_t<kSwap, ColVec, RowVec>;
  using ScaleB = std::conditional_t<kSwap, RowVec, ColVec>;
  using Bias = std::conditional_t<kSwap, RowBias, ColBias>;

  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using MulB = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleB,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiply_add, OutT, float, kRound>, ScaleA, MulB, Bias>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float,
      void, LayoutD, kAlignD,  // no C operand: the bias comes in through the visitor tree
      OutT, LayoutD, kAlignD, EpilogueSchedule_, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignAB, ElementAB, LayoutB,
      kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;

  using Kernel = EarlyTriggerKernel<
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileScheduler_>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments make_args(const ScaledMmArgs& p, const RunOpts& o) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    const auto* a = static_cast<const ElementAB*>(p.a);
    const auto* w = static_cast<const ElementAB*>(p.b);
    const int M = static_cast<int>(p.M), N = static_cast<int>(p.N), K = static_cast<int>(p.K);
    (void)M; (void)N; (void)K;

    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    StrideD dD{};
    if constexpr (kSwap) {
      // GEMM (N x M x K): A' = weight [N, K] (row stride ldb), B' = activations [M, K] (row stride lda).
      args.problem_shape = {N, M, K, 1};
      args.mainloop.ptr_A = w;
      args.mainloop.dA = StrideA{p.ldb, _1{}, int64_t(0)};
      args.mainloop.ptr_B = a;
      args.mainloop.dB = StrideB{p.lda, _1{}, int64_t(0)};
      dD = StrideD{_1{}, p.ldo, int64_t(0)};
    } else {
      args.problem_shape = {M, N, K, 1};
      args.mainloop.ptr_A = a;
      args.mainloop.dA = StrideA{p.lda, _1{}, int64_t(0)};
      args.mainloop.ptr_B = w;
      args.mainloop.dB = StrideB{p.ldb, _1{}, int64_t(0)};
      dD = StrideD{p.ldo, _1{}, int64_t(0)};
    }
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = dD;
    args.epilogue.ptr_D = static_cast<OutT*>(p.out);
    args.epilogue.dD = dD;

    // Visitor tree arguments, children before their node: {ScaleA, {ScaleB, Acc, op}, Bias, op}.
    typename ScaleA::Arguments sa{};
    typename ScaleB::Arguments sb{};
    typename Bias::Arguments bi{};
    const auto* bias = static_cast<const OutT*>(p.bias);
    if constexpr (kSwap) {
      sa.ptr_row = p.scale_a;
      sa.dRow = {_0{}, p.scale_a_per_row, _0{}};
      sb.ptr_col = p.scale_b;
      sb.dCol = {p.scale_b_per_col, _0{}, _0{}};
      bi.ptr_col = bias;
    } else {
      sa.ptr_col = p.scale_a;
      sa.dCol = {p.scale_a_per_row, _0{}, _0{}};
      sb.ptr_row = p.scale_b;
      sb.dRow = {_0{}, p.scale_b_per_col, _0{}};
      bi.ptr_row = bias;
    }
    args.epilogue.thread = {sa, {sb, {}, {}}, bi, {}};

    args.hw_info.device_id = 0;  // only used for queries we answer ourselves via sm_count
    args.hw_info.sm_count = p.sm_count;

    set_schedule<kStreamK>(args.scheduler, o);
    return args;
  }

  static size_t workspace(const ScaledMmArgs& p, const RunOpts& o) {
    return Gemm::get_workspace_size(make_args(p, o));
  }

  static int run(const ScaledMmArgs& p, const RunOpts& o, const Err& err, const char* name) {
    return launch_gemm<Gemm>(make_args(p, o), p, o.programmatic, err, kInt8 ? "int8" : "fp8", name);
  }
};

// Schedules by mainloop. For e4m3 operands with the plain schedules, CUTLASS's builder picks its FP8
// mainloop that promotes the tensor cores' partial sums into fp32 registers every 4 WGMMAs (its
// default mma_promotion_interval: one 128-deep K tile); with the FP8FastAccum schedules the tensor
// cores accumulate throughout. s8 takes the plain ones (int32 accumulation needs no promotion).
template <Mainloop kMain>
using ElementOf = std::conditional_t<kMain == Mainloop::kInt8, int8_t, cutlass::float_e4m3_t>;
template <Mainloop kMain>
struct Coop {
  using Kernel = std::conditional_t<kMain == Mainloop::kFp8Fast, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                                    cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using Epi = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Sched = cutlass::gemm::StreamKScheduler;
};
template <Mainloop kMain>
struct Ping {
  using Kernel = std::conditional_t<kMain == Mainloop::kFp8Fast, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                                    cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
  using Sched = cutlass::gemm::PersistentScheduler;
};

// Config id -> kernel type, from the X-macro lists.
template <Mainloop kMain, int OutTag, class Tile, class Cluster, template <Mainloop> class Schedule, bool kSwap>
using ConfigGemm = W8A8Gemm<ElementOf<kMain>, std::conditional_t<OutTag == 0, cutlass::bfloat16_t, cutlass::half_t>,
                            Tile, Cluster, typename Schedule<kMain>::Kernel, typename Schedule<kMain>::Epi,
                            typename Schedule<kMain>::Sched, kSwap>;

template <int Id, int OutTag>
struct ConfigType;
template <Mainloop kMain, int Id, int OutTag>
struct PlainConfigType;
#define QB_TYPE(id, name, swap, tm, tn, tk, cm, cn, sched)                                                 \
  template <int OutTag>                                                                                 \
  struct ConfigType<id, OutTag> {                                                                       \
    using type = ConfigGemm<Mainloop::kFp8Fast, OutTag, Shape<Int<tm>, Int<tn>, Int<tk>>,                 \
                            Shape<Int<cm>, Int<cn>, _1>, sched, swap>;                                  \
  };
QB_SM90_FP8_CONFIGS(QB_TYPE)
#undef QB_TYPE
#define QB_PLAIN_TYPE(id, name, swap, tm, tn, tk, cm, cn, sched)                                             \
  template <Mainloop kMain, int OutTag>                                                                 \
  struct PlainConfigType<kMain, id, OutTag> {                                                           \
    using type = ConfigGemm<kMain, OutTag, Shape<Int<tm>, Int<tn>, Int<tk>>, Shape<Int<cm>, Int<cn>, _1>,  \
                            sched, swap>;                                                               \
  };
QB_SM90_PLAIN_CONFIGS(QB_PLAIN_TYPE)
#undef QB_PLAIN_TYPE

template <int Id, int OutTag>
int run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err) {
  return ConfigType<Id, OutTag>::type::run(args, opts, err, kConfigs[Id].name);
}
template <int Id, int OutTag>
size_t config_workspace(const ScaledMmArgs& args, const RunOpts& opts) {
  return ConfigType<Id, OutTag>::type::workspace(args, opts);
}
template <Mainloop kMain, int Id, int OutTag>
int plain_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err) {
  return PlainConfigType<kMain, Id, OutTag>::type::run(args, opts, err, kPlainConfigs[Id].name);
}
template <Mainloop kMain, int Id, int OutTag>
size_t plain_config_workspace(const ScaledMmArgs& args, const RunOpts& opts) {
  return PlainConfigType<kMain, Id, OutTag>::type::workspace(args, opts);
}

#define QB_SM90_INSTANTIATE(id, tag)                                                       \
  template int run_config<id, tag>(const ScaledMmArgs&, const RunOpts&, const Err&); \
  template size_t config_workspace<id, tag>(const ScaledMmArgs&, const RunOpts&);
#define QB_SM90_PLAIN_INSTANTIATE(main, id, tag)                                                       \
  template int plain_run_config<main, id, tag>(const ScaledMmArgs&, const RunOpts&, const Err&); \
  template size_t plain_config_workspace<main, id, tag>(const ScaledMmArgs&, const RunOpts&);

}  // namespace qb::sm90
