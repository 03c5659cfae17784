// fp8_grouped_sm90_kernel.cuh: the CUTLASS 3.x kernel template behind every SM90 grouped FP8
// config (a mixture of experts' layers in one launch).
//
// Group g is rows [start_g, end_g) of A times expert weight g, scaled in one of two ways:
//   block (kBlock):  as fp8_block_sm90_kernel.cuh: the products of each 128-deep K block are
//                    accumulated in fp32 by the tensor cores, scaled by the block's two scales and
//                    added into a second fp32 accumulator; the epilogue adds the bias.
//   rows / columns:  as w8a8_sm90_kernel.cuh: FP8 fast accumulation, then the epilogue computes
//                    scale_a(row) * (scale_b(g, col) * acc) + bias[g, col], each scale per-tensor
//                    (per group for scale_b) or per row / column through a run-time bool stride.
//
// CUTLASS's ptr-array kernel takes, for each group, a problem size and pointers to its operands,
// scales and bias. Those follow from `offsets`, which lives on the device and changes between CUDA
// graph replays, so a one-block kernel (prepare_groups) turns offsets into those arrays in the
// caller's workspace right before the GEMM; the grouped tile scheduler then reads the sizes on the
// device, and the epilogue's broadcasts take the group's pointers. No host sync. Ends are clamped as
// in the sm89 family (the running maximum of min(max(end, 0), M)), and rows at or past the last end
// are written as NaN by the same launch's other blocks.
//
// Scales need no copy: block scale_a [M, K/128] row-major is per group a K-major [rows_g, K/128]
// block starting at row start_g, block scale_b [G, K/128, N/128] per group an N-major
// [K/128, N/128]; per-token scale_a [M] starts at start_g, per-channel scale_b [G, N] at g * N.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "block_scaled_operands.h"
#include "cutlass_launch.cuh"  // EarlyTriggerKernel, launch_gemm
#include "fp8_grouped_sm90_configs.h"

namespace qb::sm90 {

using namespace cute;

// Byte offsets of the per-group arrays inside the caller's workspace, after CUTLASS's own scratch.
struct GroupedLayout {
  size_t problems, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d;
  size_t ptr_sfa, ptr_sfb, layout_sfa, layout_sfb;  // block scales
  size_t ptr_scale_tokens, ptr_scale_weight;         // row / column scales
  size_t ptr_bias;
  size_t total;
};

// Reserves `bytes` at the next 128-byte boundary of `at`; returns its offset.
inline size_t carve(size_t& at, size_t bytes) {
  const size_t start = (at + 127) / 128 * 128;
  at = start + bytes;
  return start;
}

namespace fusion = cutlass::epilogue::fusion;

// The epilogue visitor trees. Broadcast element types are pointers: one pointer per group, taken by
// the group's index (CUTLASS's array-of-pointers broadcasts). GEMM rows are tokens unswapped and
// channels swapped.
template <class OutT, class TileShape, bool kSwap>
struct GroupedEpilogueOps {
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using RowBias = fusion::Sm90ColBroadcast<0, TileShape, OutT*, float, Stride<_1, _0, _0>>;
  using ColBias = fusion::Sm90RowBroadcast<0, TileShape, OutT*, float, Stride<_0, _1, _0>>;
  using Bias = std::conditional_t<kSwap, RowBias, ColBias>;
  // Block scales: out = acc + bias.
  using BlockFusion = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, OutT, float, kRound>, fusion::Sm90AccFetch, Bias>;
  // Row / column scales: out = scale_tokens * (scale_weight * acc) + bias, each scale a vector or a
  // scalar per the bool stride.
  using RowVec = fusion::Sm90ColBroadcast<0, TileShape, float*, float, Stride<bool, _0, _0>>;
  using ColVec = fusion::Sm90RowBroadcast<0, TileShape, float*, float, Stride<_0, bool, _0>>;
  using ScaleTokens = std::conditional_t<kSwap, ColVec, RowVec>;
  using ScaleWeight = std::conditional_t<kSwap, RowVec, ColVec>;
  using MulWeight = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleWeight,
                                    fusion::Sm90AccFetch>;
  using ScaledFusion =
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiply_add, OutT, float, kRound>, ScaleTokens, MulWeight, Bias>;
};

template <class Cfg>
__global__ void prepare_groups(typename Cfg::PrepParams p);

template <class OutT_, class TileShape_, class ClusterShape_, bool kSwap_, bool kBlock_>
struct Fp8GroupedGemm : BlockScaledOperands<OutT_, kSwap_> {
  using Operands = BlockScaledOperands<OutT_, kSwap_>;
  using typename Operands::E4M3, typename Operands::LayoutA, typename Operands::LayoutB;
  using typename Operands::LayoutD, typename Operands::LayoutSFA, typename Operands::LayoutSFB;
  using typename Operands::OutT, typename Operands::ScaleConfig;
  using Operands::kAlignAB, Operands::kAlignD, Operands::kGroup, Operands::kSwap;
  using TileShape = TileShape_;
  static constexpr bool kBlock = kBlock_;
  static constexpr int kPrepThreads = 1024;  // one thread per group
  static_assert(kPrepThreads >= kMaxGroups, "prepare_groups gives each group one thread of one block");
  static constexpr int kFillBlocks = 16;     // blocks writing NaN into rows past the last end

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
  using GroupShape = typename ProblemShape::UnderlyingProblemShape;
  using Ops = GroupedEpilogueOps<OutT, TileShape, kSwap>;
  using Fusion = std::conditional_t<kBlock, typename Ops::BlockFusion, typename Ops::ScaledFusion>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape_,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, OutT, LayoutD*,
      kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

  // Block scales ride with the operands into the blockwise mainloop; otherwise FP8 fast accumulation.
  using OperandA = std::conditional_t<kBlock, cute::tuple<LayoutA*, LayoutSFA*>, LayoutA*>;
  using OperandB = std::conditional_t<kBlock, cute::tuple<LayoutB*, LayoutSFB*>, LayoutB*>;
  using Schedule = std::conditional_t<kBlock, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, OperandA, kAlignAB, E4M3, OperandB, kAlignAB, float,
      TileShape, ClusterShape_,
      cutlass::gemm::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;

  using Kernel = EarlyTriggerKernel<cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  // Where each per-group array goes in a workspace whose first `cutlass_bytes` are CUTLASS's.
  static GroupedLayout layout(int64_t groups, size_t cutlass_bytes) {
    GroupedLayout l{};
    size_t at = cutlass_bytes;
    const size_t g = static_cast<size_t>(groups), ptrs = g * sizeof(void*);
    l.problems = carve(at, g * sizeof(GroupShape));
    l.ptr_a = carve(at, ptrs);
    l.ptr_b = carve(at, ptrs);
    l.ptr_d = carve(at, ptrs);
    l.stride_a = carve(at, g * sizeof(StrideA));
    l.stride_b = carve(at, g * sizeof(StrideB));
    l.stride_d = carve(at, g * sizeof(StrideD));
    if constexpr (kBlock) {
      l.ptr_sfa = carve(at, ptrs);
      l.ptr_sfb = carve(at, ptrs);
      l.layout_sfa = carve(at, g * sizeof(LayoutSFA));
      l.layout_sfb = carve(at, g * sizeof(LayoutSFB));
    } else {
      l.ptr_scale_tokens = carve(at, ptrs);
      l.ptr_scale_weight = carve(at, ptrs);
    }
    l.ptr_bias = carve(at, ptrs);
    l.total = carve(at, 0);
    return l;
  }

  // The GEMM's arguments with the arrays at `ws` (which may be null for a size query: nothing is read).
  static typename Gemm::Arguments make_args(const GroupedArgs& p, int sm_count, char* ws, const GroupedLayout& l) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {static_cast<int>(p.groups), reinterpret_cast<GroupShape*>(ws + l.problems), nullptr};
    auto& ml = args.mainloop;
    ml.ptr_A = reinterpret_cast<const E4M3**>(ws + l.ptr_a);
    ml.dA = reinterpret_cast<StrideA*>(ws + l.stride_a);
    ml.ptr_B = reinterpret_cast<const E4M3**>(ws + l.ptr_b);
    ml.dB = reinterpret_cast<StrideB*>(ws + l.stride_b);
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = reinterpret_cast<StrideD*>(ws + l.stride_d);
    args.epilogue.ptr_D = reinterpret_cast<OutT**>(ws + l.ptr_d);
    args.epilogue.dD = reinterpret_cast<StrideD*>(ws + l.stride_d);
    // A null array of bias pointers reads as zeros.
    const auto* bias = p.bias ? reinterpret_cast<OutT const* const*>(ws + l.ptr_bias) : nullptr;
    typename Ops::Bias::Arguments bi{};
    if constexpr (kSwap) bi.ptr_col = bias;
    else bi.ptr_row = bias;
    if constexpr (kBlock) {
      ml.ptr_SFA = reinterpret_cast<const float**>(ws + l.ptr_sfa);
      ml.layout_SFA = reinterpret_cast<LayoutSFA*>(ws + l.layout_sfa);
      ml.ptr_SFB = reinterpret_cast<const float**>(ws + l.ptr_sfb);
      ml.layout_SFB = reinterpret_cast<LayoutSFB*>(ws + l.layout_sfb);
      args.epilogue.thread = {{}, bi, {}};
    } else {
      const auto* tokens = reinterpret_cast<float const* const*>(ws + l.ptr_scale_tokens);
      const auto* weight = reinterpret_cast<float const* const*>(ws + l.ptr_scale_weight);
      typename Ops::ScaleTokens::Arguments st{};
      typename Ops::ScaleWeight::Arguments sw{};
      if constexpr (kSwap) {
        st.ptr_row = tokens;
        st.dRow = {_0{}, p.scale_a_per_row, _0{}};
        sw.ptr_col = weight;
        sw.dCol = {p.scale_b_per_col, _0{}, _0{}};
      } else {
        st.ptr_col = tokens;
        st.dCol = {p.scale_a_per_row, _0{}, _0{}};
        sw.ptr_row = weight;
        sw.dRow = {_0{}, p.scale_b_per_col, _0{}};
      }
      args.epilogue.thread = {st, {sw, {}, {}}, bi, {}};
    }
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static size_t cutlass_workspace(const GroupedArgs& p, int sm_count) {
    return Gemm::get_workspace_size(make_args(p, sm_count, nullptr, layout(p.groups, 0)));
  }

  static size_t workspace(const GroupedArgs& p, int sm_count) {
    return layout(p.groups, cutlass_workspace(p, sm_count)).total;
  }

  struct PrepParams {
    const uint8_t* a;
    const uint8_t* b;
    OutT* out;
    const OutT* bias;
    const int32_t* offsets;
    const float* scale_a;
    const float* scale_b;
    char* ws;
    GroupedLayout l;
    int64_t lda, ldb, ldb_group, ldo;
    int M, N, K, groups, kb, nb;
    bool scale_a_per_row, scale_b_per_col;
  };

  static int run(const GroupedArgs& p, int sm_count, const Err& err, const char* name) {
    const size_t cutlass_bytes = cutlass_workspace(p, sm_count);
    const GroupedLayout l = layout(p.groups, cutlass_bytes);
    if (p.workspace == nullptr || p.workspace_size < l.total)
      return err.set(QB_ERR_INVALID_ARGUMENT, "sm90 fp8 grouped config %s needs %zu bytes of workspace, got %zu",
                     name, l.total, p.workspace ? p.workspace_size : size_t(0));
    char* ws = static_cast<char*>(p.workspace);
    PrepParams pp{};
    pp.a = static_cast<const uint8_t*>(p.a);
    pp.b = static_cast<const uint8_t*>(p.b);
    pp.out = static_cast<OutT*>(p.out);
    pp.bias = static_cast<const OutT*>(p.bias);
    pp.offsets = p.offsets;
    pp.scale_a = p.scale_a;
    pp.scale_b = p.scale_b;
    pp.ws = ws;
    pp.l = l;
    pp.lda = p.lda;
    pp.ldb = p.ldb;
    pp.ldb_group = p.ldb_group;
    pp.ldo = p.ldo;
    pp.M = static_cast<int>(p.M);
    pp.N = static_cast<int>(p.N);
    pp.K = static_cast<int>(p.K);
    pp.groups = static_cast<int>(p.groups);
    pp.kb = static_cast<int>(cdiv(p.K, kGroup));
    pp.nb = static_cast<int>(cdiv(p.N, kGroup));
    pp.scale_a_per_row = p.scale_a_per_row;
    pp.scale_b_per_col = p.scale_b_per_col;
    prepare_groups<Fp8GroupedGemm><<<1 + kFillBlocks, kPrepThreads, 0, p.stream>>>(pp);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
      return err.set(QB_ERR_CUDA, "sm90 fp8 grouped: argument kernel launch failed: %s", cudaGetErrorString(e));
    // Not a programmatic launch: the scheduler reads the group sizes the kernel above writes.
    return launch_gemm<Gemm>(make_args(p, sm_count, ws, l), GemmLaunch{p.stream, ws, cutlass_bytes, false},
                             err, "fp8 grouped", name, p.M, p.N, p.K);
  }
};

// Block 0: group sizes and argument arrays. Blocks 1..kFillBlocks: NaN into rows [last end, M).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kPrepThreads) prepare_groups(typename Cfg::PrepParams p) {
  using GroupShape = typename Cfg::GroupShape;
  using OutT = typename Cfg::OutT;
  constexpr int kPrepThreads = Cfg::kPrepThreads, kFillBlocks = Cfg::kFillBlocks;
  constexpr bool kSwap = Cfg::kSwap;
  __shared__ int ends[kPrepThreads];
  const int t = threadIdx.x;
  const int end = t < p.groups ? min(max(__ldg(p.offsets + t), 0), p.M) : 0;
  if (blockIdx.x > 0) {
    // The last clamped end is the largest one.
    __shared__ int last_end;
    if (t == 0) last_end = 0;
    __syncthreads();
    if (t < p.groups) atomicMax(&last_end, end);
    __syncthreads();
    const int64_t first = int64_t(last_end) * p.N, count = int64_t(p.M) * p.N - first;
    const OutT nan = OutT(NAN);
    for (int64_t i = (blockIdx.x - 1) * int64_t(kPrepThreads) + t; i < count;
         i += int64_t(kFillBlocks) * kPrepThreads) {
      const int64_t e = first + i, row = e / p.N;
      p.out[row * p.ldo + (e - row * p.N)] = nan;
    }
    return;
  }
  // Inclusive running maximum of the clamped ends (Hillis-Steele over the block).
  ends[t] = end;
  for (int o = 1; o < kPrepThreads; o <<= 1) {
    __syncthreads();
    const int v = t >= o ? ends[t - o] : 0;
    __syncthreads();
    ends[t] = max(ends[t], v);
  }
  __syncthreads();
  if (t >= p.groups) return;
  const int stop = ends[t], start = t > 0 ? ends[t - 1] : 0, rows = stop - start;
  char* ws = p.ws;
  const GroupedLayout& l = p.l;
  const uint8_t* tokens = p.a + int64_t(start) * p.lda;
  const uint8_t* weight = p.b + int64_t(t) * p.ldb_group;
  const GroupShape shape = kSwap ? GroupShape{p.N, rows, p.K} : GroupShape{rows, p.N, p.K};
  reinterpret_cast<GroupShape*>(ws + l.problems)[t] = shape;
  reinterpret_cast<const void**>(ws + l.ptr_a)[t] = kSwap ? static_cast<const void*>(weight) : tokens;
  reinterpret_cast<const void**>(ws + l.ptr_b)[t] = kSwap ? static_cast<const void*>(tokens) : weight;
  reinterpret_cast<OutT**>(ws + l.ptr_d)[t] = p.out + int64_t(start) * p.ldo;
  reinterpret_cast<const OutT**>(ws + l.ptr_bias)[t] = p.bias ? p.bias + int64_t(t) * p.N : nullptr;
  // Both operands are K-contiguous with their row stride in mode 0; D's row stride is mode 0
  // unswapped (row-major [rows, N]) and mode 1 swapped (column-major [N, rows]).
  typename Cfg::StrideA sa{};
  get<0>(sa) = kSwap ? p.ldb : p.lda;
  typename Cfg::StrideB sb{};
  get<0>(sb) = kSwap ? p.lda : p.ldb;
  typename Cfg::StrideD sd{};
  get<kSwap ? 1 : 0>(sd) = p.ldo;
  reinterpret_cast<typename Cfg::StrideA*>(ws + l.stride_a)[t] = sa;
  reinterpret_cast<typename Cfg::StrideB*>(ws + l.stride_b)[t] = sb;
  reinterpret_cast<typename Cfg::StrideD*>(ws + l.stride_d)[t] = sd;
  if constexpr (Cfg::kBlock) {
    const float* sf_tokens = p.scale_a + int64_t(start) * p.kb;
    const float* sf_weight = p.scale_b + int64_t(t) * p.kb * p.nb;
    reinterpret_cast<const float**>(ws + l.ptr_sfa)[t] = kSwap ? sf_weight : sf_tokens;
    reinterpret_cast<const float**>(ws + l.ptr_sfb)[t] = kSwap ? sf_tokens : sf_weight;
    const auto mnkl = make_shape(get<0>(shape), get<1>(shape), get<2>(shape), 1);
    reinterpret_cast<typename Cfg::LayoutSFA*>(ws + l.layout_sfa)[t] = Cfg::ScaleConfig::tile_atom_to_shape_SFA(mnkl);
    reinterpret_cast<typename Cfg::LayoutSFB*>(ws + l.layout_sfb)[t] = Cfg::ScaleConfig::tile_atom_to_shape_SFB(mnkl);
  } else {
    reinterpret_cast<const float**>(ws + l.ptr_scale_tokens)[t] = p.scale_a + (p.scale_a_per_row ? start : 0);
    reinterpret_cast<const float**>(ws + l.ptr_scale_weight)[t] =
        p.scale_b + int64_t(t) * (p.scale_b_per_col ? p.N : 1);
  }
}

template <int Id, int OutTag>
struct GroupedConfigType;
#define QB_GROUPED_TYPE(id, name, block, swap, tm, tn, cm, cn)                                              \
  template <int OutTag>                                                                                   \
  struct GroupedConfigType<id, OutTag> {                                                                  \
    using OutT = std::conditional_t<OutTag == 0, cutlass::bfloat16_t, cutlass::half_t>;                  \
    using type = Fp8GroupedGemm<OutT, Shape<Int<tm>, Int<tn>, _128>, Shape<Int<cm>, Int<cn>, _1>, swap, block>; \
  };
QB_SM90_FP8_GROUPED_CONFIGS(QB_GROUPED_TYPE)
#undef QB_GROUPED_TYPE

template <int Id, int OutTag>
int grouped_run_config(const GroupedArgs& args, int sm_count, const Err& err) {
  return GroupedConfigType<Id, OutTag>::type::run(args, sm_count, err, kGroupedConfigs[Id].name);
}
template <int Id, int OutTag>
size_t grouped_config_workspace(const GroupedArgs& args, int sm_count) {
  return GroupedConfigType<Id, OutTag>::type::workspace(args, sm_count);
}

#define QB_SM90_GROUPED_INSTANTIATE(id, tag)                                           \
  template int grouped_run_config<id, tag>(const GroupedArgs&, int, const Err&); \
  template size_t grouped_config_workspace<id, tag>(const GroupedArgs&, int);

}  // namespace qb::sm90
