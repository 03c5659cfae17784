// int8_sm80_family.cuh: the SM80 (Ampere) INT8 configs: CUTLASS 2.x, cp.async multistage,
// mma.sync m16n8k32 s8 with int32 accumulation, compiled to sm_80 SASS + compute_80 PTX (the PTX
// is what runs on sm_89/sm_90 devices). Narrow tiles for small M, 128x128 for large M.
#pragma once

#include "../common/cutlass2x_scaled_mm.cuh"

namespace qb::sm80 {

using cutlass::gemm::GemmShape;

template <class TB, class W, int S, class OutT>
using Gemm = c2x::ScaledGemm<cutlass::arch::Sm80, int8_t, OutT, TB, W, GemmShape<16, 8, 32>, S,
                             cutlass::arch::OpMultiplyAddSaturate>;

struct Int8Family {
  static constexpr int kNumConfigs = 3;
  static constexpr const char* kNames[kNumConfigs] = {"sm80_32x64x128_w16x64_s5", "sm80_64x128x128_w32x64_s4", "sm80_128x128x64_w64x64_s5"};
  static int pick(const ScaledMmArgs& a) { return a.M <= 32 ? 0 : (a.M <= 128 ? 1 : 2); }

  template <int Id, class OutT>
  struct Config;
  template <class OutT>
  struct Config<0, OutT> {
    using type = Gemm<GemmShape<32, 64, 128>, GemmShape<16, 64, 128>, 5, OutT>;
  };
  template <class OutT>
  struct Config<1, OutT> {
    using type = Gemm<GemmShape<64, 128, 128>, GemmShape<32, 64, 128>, 4, OutT>;
  };
  template <class OutT>
  struct Config<2, OutT> {
    using type = Gemm<GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 5, OutT>;
  };

  template <int Id, class OutT>
  static int run(const ScaledMmArgs& a, bool streamk, const Err& err);
  template <int Id, class OutT>
  static size_t workspace(const ScaledMmArgs& a, bool streamk);
};

}  // namespace qb::sm80
