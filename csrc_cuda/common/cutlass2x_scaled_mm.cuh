// cutlass2x_scaled_mm.cuh: the CUTLASS 2.x (mma.sync) scaled GEMM shared by the SM89 FP8 and the
// SM80 / SM75 INT8 families. Header only; included by sm89/, sm80/ and sm75/ sources, never by a
// common/ translation unit (it would then be compiled for every arch).
//
//   out[M, N] = scale_a[m or 0] * (scale_b[n or 0] * acc) + bias[n]     (acc fp32 or int32)
//
// built as an epilogue visitor tree (EVT) over a stream-K capable GEMM: with a workspace the
// stream-K swizzle balances tiles (and K) over the SMs; without one it runs data-parallel.
// Per-tensor vs per-row/column scales and bias on/off are run-time choices of one instantiation.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/default_gemm_universal_with_visitor.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle_streamk.h>
#include <cutlass/epilogue/threadblock/fusion/visitors.hpp>  // after the GEMM headers it builds on

#include "qb_common.h"

namespace qb::c2x {

using namespace cute;

// One value per GEMM column (scale_b, bias), or one value for all (scalar, stride 0), or zeros when
// the pointer is NULL. Loads element by element: unlike CUTLASS's VisitorRowBroadcast it needs no
// vector alignment and takes the scalar/vector choice at run time.
template <class ThreadMap, class Element>
struct VisitorRowScaleOrVector {
  struct Arguments {
    const Element* ptr = nullptr;
    int64_t stride = 1;  // 1: [N] vector; 0: one value
  };
  using Params = Arguments;
  struct SharedStorage {};

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  CUTLASS_HOST_DEVICE VisitorRowScaleOrVector() {}
  CUTLASS_HOST_DEVICE VisitorRowScaleOrVector(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr;

  template <class GTensor, class RTensor, class CTensor, class ProblemShape>
  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(GTensor&& g, RTensor&& r, CTensor&& c, ProblemShape problem_shape, Params const* p)
        : tC_gRow(cute::forward<GTensor>(g)),
          tC_rRow(cute::forward<RTensor>(r)),
          tC_cRow(cute::forward<CTensor>(c)),
          n(get<1>(problem_shape)),
          params_ptr(p) {}

    GTensor tC_gRow;  // (VECTOR, FRAGMENT_COLUMN) elements in global memory
    RTensor tC_rRow;  // their register copy
    CTensor tC_cRow;  // their (m, n, l) coordinates
    int n;
    Params const* params_ptr;

    CUTLASS_DEVICE void begin_epilogue() {
      if (params_ptr->ptr == nullptr) {
        fill(tC_rRow, Element(0));
        return;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tC_rRow); ++i) tC_rRow(i) = get<1>(tC_cRow(i)) < n ? tC_gRow(i) : Element(0);
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc) {
      Tensor rRow_frg = recast<cutlass::Array<Element, FragmentSize>>(coalesce(tC_rRow));
      return rRow_frg(column_idx);
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    Tensor mRow = make_tensor(make_gmem_ptr(params_ptr->ptr), problem_shape,
                              make_stride(_0{}, params_ptr->stride, _0{}));
    Tensor tC_gRow = ThreadMap::partition(mRow, thread_idx, threadblock_tile_offset)(_, _, _0{}, _0{}, _0{}, _0{});
    Tensor tC_rRow = make_tensor_like(tC_gRow);
    Tensor cRow = make_identity_tensor(mRow.shape());
    Tensor tC_cRow = ThreadMap::partition(cRow, thread_idx, threadblock_tile_offset)(_, _, _0{}, _0{}, _0{}, _0{});
    return Callbacks<decltype(tC_gRow), decltype(tC_rRow), decltype(tC_cRow), ProblemShape>(
        cute::move(tC_gRow), cute::move(tC_rRow), cute::move(tC_cRow), problem_shape, params_ptr);
  }
};

template <class ArchTag, class ElementAB, class OutT_, class TileShape, class WarpShape, class InstShape, int kStages,
          class MathOp>
struct ScaledGemm {
  using OutT = OutT_;
  using Acc = std::conditional_t<std::is_same_v<ElementAB, int8_t>, int32_t, float>;
  static constexpr int kAlignAB = 16;  // 16 bytes of 8-bit operands
  static constexpr int kAlignD = 16 / sizeof(OutT);
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  using ThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<TileShape, WarpShape, OutT, kAlignD, 1>;
  using AccFetch = cutlass::epilogue::threadblock::VisitorAccFetch;
  // scale_a: one per row (M stride 1) or one for all (M stride 0), chosen at run time.
  using ScaleA = cutlass::epilogue::threadblock::VisitorColBroadcast<ThreadMap, float, Stride<int64_t, _0, _0>>;
  using ScaleB = VisitorRowScaleOrVector<ThreadMap, float>;
  using Bias = VisitorRowScaleOrVector<ThreadMap, OutT>;
  using MulB = cutlass::epilogue::threadblock::Sm80EVT<
      cutlass::epilogue::threadblock::VisitorCompute<cutlass::multiplies, float, float, kRound>, ScaleB, AccFetch>;
  using Fma = cutlass::epilogue::threadblock::Sm80EVT<
      cutlass::epilogue::threadblock::VisitorCompute<cutlass::multiply_add, OutT, float, kRound>, ScaleA, MulB, Bias>;
  using Store = cutlass::epilogue::threadblock::VisitorAuxStore<ThreadMap, OutT, kRound, Stride<int64_t, _1, int64_t>>;
  using Fusion = cutlass::epilogue::threadblock::Sm80EVT<Store, Fma>;

  using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      ElementAB, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, kAlignAB, ElementAB,
      cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, kAlignAB, OutT, cutlass::layout::RowMajor,
      kAlignD, Acc, float, cutlass::arch::OpClassTensorOp, ArchTag, TileShape, WarpShape, InstShape, Fusion,
      cutlass::gemm::threadblock::ThreadblockSwizzleStreamK, kStages, MathOp, 1>::GemmKernel;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // streamk: balance over all SMs (needs the workspace); else classic data-parallel (avail_sms 1).
  static typename Gemm::Arguments make_args(const ScaledMmArgs& p, bool streamk) {
    typename Fusion::Arguments fusion{
        {
            {p.scale_a, 0.0f, {int64_t(p.scale_a_per_row ? 1 : 0), _0{}, _0{}}},         // ScaleA
            {{p.scale_b, int64_t(p.scale_b_per_col ? 1 : 0)}, {}, {}},                     // MulB
            {static_cast<const OutT*>(p.bias), int64_t(1)},                                 // Bias
            {}                                                                              // Fma
        },
        {static_cast<OutT*>(p.out), {p.ldo, _1{}, int64_t(0)}}                              // Store
    };
    return typename Gemm::Arguments(cutlass::gemm::GemmUniversalMode::kGemm,
                                    {int(p.M), int(p.N), int(p.K)}, 1, fusion, p.a, p.b, nullptr, nullptr,
                                    0, 0, 0, 0, p.lda, p.ldb, 0, 0, streamk ? p.sm_count : 1);
  }

  static size_t workspace(const ScaledMmArgs& p, bool streamk) {
    return Gemm::get_workspace_size(make_args(p, streamk));
  }

  static int run(const ScaledMmArgs& p, bool streamk, const Err& err, const char* name) {
    auto args = make_args(p, streamk);
    cutlass::Status st = Gemm::can_implement(args);
    if (st != cutlass::Status::kSuccess)
      return err.set(QB_ERR_UNSUPPORTED, "%s cannot implement M=%lld N=%lld K=%lld: %s", name, (long long)p.M,
                     (long long)p.N, (long long)p.K, cutlass::cutlassGetStatusString(st));
    const size_t ws = Gemm::get_workspace_size(args);
    if (ws > 0 && (p.workspace == nullptr || p.workspace_size < ws))
      return err.set(QB_ERR_INVALID_ARGUMENT, "%s needs %zu bytes of workspace, got %zu", name, ws, p.workspace_size);
    Gemm gemm;
    st = gemm.initialize(args, ws ? p.workspace : nullptr, p.stream);
    if (st != cutlass::Status::kSuccess) {
      cudaError_t e = cudaGetLastError();
      return err.set(QB_ERR_CUDA, "%s: CUTLASS initialize failed: %s (CUDA: %s)", name,
                     cutlass::cutlassGetStatusString(st), cudaGetErrorString(e));
    }
    st = gemm.run(p.stream);
    cudaError_t e = cudaGetLastError();
    if (st != cutlass::Status::kSuccess || e != cudaSuccess)
      return err.set(QB_ERR_CUDA, "%s: kernel launch failed: %s (CUDA: %s)", name, cutlass::cutlassGetStatusString(st),
                     cudaGetErrorString(e));
    return QB_OK;
  }
};

// A family (see sm89/fp8_sm89_family.cuh): Family::Config<Id, OutT>::type is a ScaledGemm,
// Family::kNames[Id] its name, Family::pick(args) the automatic choice, and the static member
// templates run<Id, OutT> / workspace<Id, OutT> are declared in the family header but defined and
// explicitly instantiated (QB_C2X_DEFINE_MEMBERS / QB_C2X_INSTANTIATE) in one translation unit per
// output type, so the dispatcher's TU instantiates no kernel and the build parallelizes.
#define QB_C2X_DEFINE_MEMBERS(Family)                                                              \
  template <int Id, class OutT>                                                                    \
  int Family::run(const ::qb::ScaledMmArgs& a, bool streamk, const ::qb::Err& err) {               \
    return Config<Id, OutT>::type::run(a, streamk, err, kNames[Id]);                               \
  }                                                                                                \
  template <int Id, class OutT>                                                                    \
  size_t Family::workspace(const ::qb::ScaledMmArgs& a, bool streamk) {                            \
    return Config<Id, OutT>::type::workspace(a, streamk);                                          \
  }
#define QB_C2X_INSTANTIATE(Family, Id, OutT)                                                       \
  template int Family::run<Id, OutT>(const ::qb::ScaledMmArgs&, bool, const ::qb::Err&);           \
  template size_t Family::workspace<Id, OutT>(const ::qb::ScaledMmArgs&, bool);

template <class Family, int Id = 0>
size_t family_workspace(const ScaledMmArgs& a, int id, bool streamk) {
  if constexpr (Id < Family::kNumConfigs) {
    if (id != Id) return family_workspace<Family, Id + 1>(a, id, streamk);
    if (a.out_dtype == QB_F16) return Family::template workspace<Id, cutlass::half_t>(a, streamk);
    return Family::template workspace<Id, cutlass::bfloat16_t>(a, streamk);
  } else {
    return 0;
  }
}

template <class Family, int Id = 0>
int family_run(const ScaledMmArgs& a, int id, bool streamk, const Err& err) {
  if constexpr (Id < Family::kNumConfigs) {
    if (id != Id) return family_run<Family, Id + 1>(a, id, streamk, err);
    if (a.out_dtype == QB_F16) return Family::template run<Id, cutlass::half_t>(a, streamk, err);
    return Family::template run<Id, cutlass::bfloat16_t>(a, streamk, err);
  } else {
    return err.set(QB_ERR_INVALID_ARGUMENT, "config %d out of range", id);
  }
}

template <class Family>
int family_config(const ScaledMmArgs& a) {
  return (a.config >= 0 && a.config < Family::kNumConfigs) ? a.config : Family::pick(a);
}

// decomp override: 0 forces data-parallel; anything else (or automatic) uses stream-K when the
// workspace covers it. The query reports the larger of the two plans, so a caller that allocates
// what it says never falls short (CUTLASS's data-parallel plan can want a small workspace too).
template <class Family>
size_t dispatch_workspace(const ScaledMmArgs& a) {
  const int id = family_config<Family>(a);
  const size_t dp = family_workspace<Family>(a, id, false);
  if (a.decomp == 0) return dp;
  const size_t sk = family_workspace<Family>(a, id, true);
  return sk > dp ? sk : dp;
}

template <class Family>
int dispatch(const ScaledMmArgs& a, const Err& err) {
  if (a.config >= Family::kNumConfigs)
    return err.set(QB_ERR_INVALID_ARGUMENT, "config %d out of range (%d configs)", a.config, Family::kNumConfigs);
  const int id = family_config<Family>(a);
  bool streamk = a.decomp != 0 && a.workspace != nullptr;
  if (streamk) streamk = a.workspace_size >= family_workspace<Family>(a, id, true);
  return family_run<Family>(a, id, streamk, err);
}

}  // namespace qb::c2x
