// fp8_block_sm90_kernel.cuh: the CUTLASS 3.x kernel template behind every SM90 block-scaled FP8 config.
//
// CUTLASS's blockwise-scaling mainloop (TMA, warp-specialized cooperative WGMMA): the products of
// each 128-deep K block are accumulated in fp32 by the tensor cores, then multiplied by that block's
// scales and added into a second fp32 accumulator in registers (two-level accumulation, no fast-
// accumulation drift across blocks). The epilogue only adds the bias and rounds to the output dtype.
//
// Scale layouts, as scaled_mm receives them (both row-major, no copies):
//   scale_a [M, ceil(K/128)]               1 x 128 groups: K-contiguous per token
//   scale_b [ceil(K/128), ceil(N/128)]     128 x 128 blocks of the [K, N] weight operand: N-contiguous
// A partial last K block is read by TMA as zeros past K; a partial last N block or token tile is
// predicated, so K and N need not be multiples of 128.
//
// kSwap computes D^T[N, M] = W[N, K] . A[M, K]^T (tokens on the tile's narrow side, see
// w8a8_sm90_kernel.cuh): the weight then carries the 128-row scale blocks and the tokens the 1-row
// ones.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler_params.h>
#include <cutlass/util/packed_stride.hpp>

#include "block_scaled_operands.h"
#include "block_scaled_overlap_mainloop.cuh"
#include "fp8_block_sm90_configs.h"
#include "cutlass_launch.cuh"  // EarlyTriggerKernel, launch_gemm, set_schedule

namespace qb::sm90 {

using namespace cute;

template <class OutT_, class TileShape_, class ClusterShape_, bool kSwap_, bool kOverlap>
struct Fp8BlockGemm : BlockScaledOperands<OutT_, kSwap_> {
  using Operands = BlockScaledOperands<OutT_, kSwap_>;
  using typename Operands::E4M3, typename Operands::LayoutA, typename Operands::LayoutB;
  using typename Operands::LayoutD, typename Operands::LayoutSFA, typename Operands::LayoutSFB;
  using typename Operands::OutT, typename Operands::ScaleConfig;
  using Operands::kAlignAB, Operands::kAlignD, Operands::kSwap;
  using TileShape = TileShape_;

  // out = acc + bias, the bias along the channels (GEMM columns unswapped, rows swapped).
  using RowBias = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, OutT, float, Stride<_1, _0, _0>>;
  using ColBias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, OutT, float, Stride<_0, _1, _0>>;
  using Bias = std::conditional_t<kSwap, RowBias, ColBias>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, OutT, float, cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape_,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, OutT, LayoutD, kAlignD,
      cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

  using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, cute::tuple<LayoutA, LayoutSFA>, kAlignAB, E4M3,
      cute::tuple<LayoutB, LayoutSFB>, kAlignAB, float, TileShape, ClusterShape_,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Mainloop = std::conditional_t<kOverlap, OverlapBlockScaledMainloop<CutlassMainloop>, CutlassMainloop>;

  using Kernel = EarlyTriggerKernel<cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                                         Epilogue, cutlass::gemm::StreamKScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments make_args(const ScaledMmArgs& p, const RunOpts& o) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    const auto* a = static_cast<const E4M3*>(p.a);
    const auto* w = static_cast<const E4M3*>(p.b);
    const int M = static_cast<int>(p.M), N = static_cast<int>(p.N), K = static_cast<int>(p.K);

    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    auto& ml = args.mainloop;
    StrideD dD{};
    if constexpr (kSwap) {
      args.problem_shape = {N, M, K, 1};
      ml.ptr_A = w;
      ml.dA = StrideA{p.ldb, _1{}, int64_t(0)};
      ml.ptr_B = a;
      ml.dB = StrideB{p.lda, _1{}, int64_t(0)};
      ml.ptr_SFA = p.scale_b;
      ml.ptr_SFB = p.scale_a;
      dD = StrideD{_1{}, p.ldo, int64_t(0)};
    } else {
      args.problem_shape = {M, N, K, 1};
      ml.ptr_A = a;
      ml.dA = StrideA{p.lda, _1{}, int64_t(0)};
      ml.ptr_B = w;
      ml.dB = StrideB{p.ldb, _1{}, int64_t(0)};
      ml.ptr_SFA = p.scale_a;
      ml.ptr_SFB = p.scale_b;
      dD = StrideD{p.ldo, _1{}, int64_t(0)};
    }
    // Packed layouts of the problem's scale tensors: exactly the row-major shapes above.
    const auto shape = kSwap ? make_shape(N, M, K, 1) : make_shape(M, N, K, 1);
    ml.layout_SFA = ScaleConfig::tile_atom_to_shape_SFA(shape);
    ml.layout_SFB = ScaleConfig::tile_atom_to_shape_SFB(shape);

    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = dD;
    args.epilogue.ptr_D = static_cast<OutT*>(p.out);
    args.epilogue.dD = dD;
    typename Bias::Arguments bi{};
    if constexpr (kSwap) bi.ptr_col = static_cast<const OutT*>(p.bias);  // null reads as zeros
    else bi.ptr_row = static_cast<const OutT*>(p.bias);
    args.epilogue.thread = {{}, bi, {}};

    args.hw_info.device_id = 0;
    args.hw_info.sm_count = p.sm_count;
    set_schedule<true>(args.scheduler, o);
    return args;
  }

  static size_t workspace(const ScaledMmArgs& p, const RunOpts& o) {
    return Gemm::get_workspace_size(make_args(p, o));
  }

  static int run(const ScaledMmArgs& p, const RunOpts& o, const Err& err, const char* name) {
    return launch_gemm<Gemm>(make_args(p, o), p, o.programmatic, err, "fp8 block", name);
  }
};

template <int Id, int OutTag>
struct BlockConfigType;
#define QB_BLOCK_TYPE(id, name, swap, tm, tn, cm, cn, overlap)                                         \
  template <int OutTag>                                                                             \
  struct BlockConfigType<id, OutTag> {                                                              \
    using OutT = std::conditional_t<OutTag == 0, cutlass::bfloat16_t, cutlass::half_t>;            \
    using type =                                                                                    \
        Fp8BlockGemm<OutT, Shape<Int<tm>, Int<tn>, _128>, Shape<Int<cm>, Int<cn>, _1>, swap, overlap>;  \
  };
QB_SM90_FP8_BLOCK_CONFIGS(QB_BLOCK_TYPE)
#undef QB_BLOCK_TYPE

template <int Id, int OutTag>
int block_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err) {
  return BlockConfigType<Id, OutTag>::type::run(args, opts, err, kBlockConfigs[Id].name);
}
template <int Id, int OutTag>
size_t block_config_workspace(const ScaledMmArgs& args, const RunOpts& opts) {
  return BlockConfigType<Id, OutTag>::type::workspace(args, opts);
}

#define QB_SM90_BLOCK_INSTANTIATE(id, tag)                                                       \
  template int block_run_config<id, tag>(const ScaledMmArgs&, const RunOpts&, const Err&); \
  template size_t block_config_workspace<id, tag>(const ScaledMmArgs&, const RunOpts&);

}  // namespace qb::sm90
