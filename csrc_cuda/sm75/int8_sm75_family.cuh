// int8_sm75_family.cuh: the SM75 (Turing) INT8 configs: CUTLASS 2.x, two-stage register-staged
// pipeline, mma.sync m8n8k16 s8 with int32 accumulation, compiled to sm_75 SASS + compute_75 PTX.
#pragma once

#include "../common/cutlass2x_scaled_mm.cuh"

namespace qb::sm75 {

using cutlass::gemm::GemmShape;

template <class TB, class W, int S, class OutT>
using Gemm = c2x::ScaledGemm<cutlass::arch::Sm75, int8_t, OutT, TB, W, GemmShape<8, 8, 16>, S,
                             cutlass::arch::OpMultiplyAddSaturate>;

struct Int8Family {
  static constexpr int kNumConfigs = 2;
  static constexpr const char* kNames[kNumConfigs] = {"sm75_64x64x64_w32x32_s2", "sm75_128x128x64_w64x64_s2"};
  static int pick(const ScaledMmArgs& a) { return a.M <= 64 ? 0 : 1; }

  template <int Id, class OutT>
  struct Config;
  template <class OutT>
  struct Config<0, OutT> {
    using type = Gemm<GemmShape<64, 64, 64>, GemmShape<32, 32, 64>, 2, OutT>;
  };
  template <class OutT>
  struct Config<1, OutT> {
    using type = Gemm<GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 2, OutT>;
  };

  template <int Id, class OutT>
  static int run(const ScaledMmArgs& a, bool streamk, const Err& err);
  template <int Id, class OutT>
  static size_t workspace(const ScaledMmArgs& a, bool streamk);
};

}  // namespace qb::sm75
