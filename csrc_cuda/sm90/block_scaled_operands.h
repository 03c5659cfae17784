// block_scaled_operands.h: the operand types every SM90 block-scaled FP8 kernel (one GEMM or grouped)
// shares, unswapped or swapped.
//
// Unswapped, A = tokens [M, K] row-major with 1 x 128 scale groups (K-major scales) and B = the
// weight, column-major [K, N], with 128 x 128 scale blocks (N-major scales); D row-major. Swapped
// (D^T = W . A^T, tokens on the tile's narrow side): A = the weight, B = the tokens, D column-major.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/layout/matrix.h>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace qb::sm90 {

template <class OutT_, bool kSwap_>
struct BlockScaledOperands {
  using OutT = OutT_;
  static constexpr bool kSwap = kSwap_;
  static constexpr int kGroup = 128;

  using E4M3 = cutlass::float_e4m3_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / sizeof(OutT);

  using ScaleConfig = std::conditional_t<
      kSwap,
      cutlass::detail::Sm90BlockwiseScaleConfig<kGroup, 1, kGroup, cute::GMMA::Major::MN, cute::GMMA::Major::K>,
      cutlass::detail::Sm90BlockwiseScaleConfig<1, kGroup, kGroup, cute::GMMA::Major::K, cute::GMMA::Major::MN>>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
};

}  // namespace qb::sm90
