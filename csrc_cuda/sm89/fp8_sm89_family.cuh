// fp8_sm89_family.cuh: the SM89 (Ada) FP8 configs: CUTLASS 2.x, mma.sync m16n8k32 e4m3 with fast
// accumulation, compiled to sm_89 SASS + compute_89 PTX (so the H200 can run it, JIT-compiled).
// Tiles follow the usual Ada FP8 choices: narrow tiles for small M (more CTAs, deep pipelines),
// 128x128 for large M. Not tuned on Ada hardware (none is reachable).
#pragma once

#include "../common/cutlass2x_scaled_mm.cuh"

namespace qb::sm89 {

using cutlass::gemm::GemmShape;

template <class TB, class W, int S, class OutT>
using Sm89Gemm = c2x::ScaledGemm<cutlass::arch::Sm89, cutlass::float_e4m3_t, OutT, TB, W, GemmShape<16, 8, 32>, S,
                                 cutlass::arch::OpMultiplyAddFastAccum>;

struct Fp8Family {
  static constexpr int kNumConfigs = 3;
  static constexpr const char* kNames[kNumConfigs] = {"sm89_32x64x128_w16x64_s5", "sm89_64x128x128_w32x64_s4",
                                                      "sm89_128x128x64_w64x64_s5"};
  static int pick(const ScaledMmArgs& a) { return a.M <= 32 ? 0 : (a.M <= 128 ? 1 : 2); }

  template <int Id, class OutT>
  struct Config;
  template <class OutT>
  struct Config<0, OutT> {
    using type = Sm89Gemm<GemmShape<32, 64, 128>, GemmShape<16, 64, 128>, 5, OutT>;
  };
  template <class OutT>
  struct Config<1, OutT> {
    using type = Sm89Gemm<GemmShape<64, 128, 128>, GemmShape<32, 64, 128>, 4, OutT>;
  };
  template <class OutT>
  struct Config<2, OutT> {
    using type = Sm89Gemm<GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 5, OutT>;
  };

  template <int Id, class OutT>
  static int run(const ScaledMmArgs& a, bool streamk, const Err& err);
  template <int Id, class OutT>
  static size_t workspace(const ScaledMmArgs& a, bool streamk);
};

}  // namespace qb::sm89
