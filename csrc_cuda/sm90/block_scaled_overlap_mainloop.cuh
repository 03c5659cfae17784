// block_scaled_overlap_mainloop.cuh: the block-scaled FP8 consumer loop with the promotion of one
// K block overlapped with the tensor-core products of the next.
//
// CUTLASS's blockwise mainloop (sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp)
// issues a K block's WGMMAs, waits for all of them, then scales the block's fp32 partial sums and
// adds them into the output accumulator. While a warpgroup scales, it has no WGMMA in flight, and
// in the cooperative schedule both consumer warpgroups read the same pipeline stage, so both scale
// at the same moments and the tensor cores idle for the whole promotion: one FFMA per accumulator
// element per 128-deep block, about a quarter of the block's MMA time at full FP8 rate.
//
// This loop keeps two partial-sum fragments. It issues block k into one, waits until only that
// batch is outstanding (block k-1 finished), releases block k-1's stage and scales block k-1 out of
// the other fragment while block k runs. The cost is one more accumulator fragment in registers
// (3 x 64 fp32 per thread for a 128 x 128 cooperative tile), which is why the configs using it stay
// at 128-wide tiles.
//
// Everything except `mma` (TMA descriptors, shared storage, the producer's loads of A, B and the
// scales, `mma_tail`) is the CUTLASS collective's: the derived type only replaces the consumer loop,
// and keeps its contract: stages 0 .. k_tile_count - 2 are released here, the last by `mma_tail`.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

namespace qb::sm90 {

// `first` when kFirst, else `second` (two tensors of different types).
template <bool kFirst, class A, class B>
CUTLASS_DEVICE auto& pick(A& first, B& second) {
  if constexpr (kFirst) return first;
  else return second;
}

template <class Base>
struct OverlapBlockScaledMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using ElementScale = typename Base::ElementBlockScale;

  // One scale per accumulator row (tokens along the tile's M side) or per column (tokens along N,
  // the swapped configs); the other operand's 128 x 128 block gives a single scale per stage.
  static constexpr bool kRowScales = Base::ScaleMsPerTile > 1;
  static_assert((Base::ScaleMsPerTile > 1) != (Base::ScaleNsPerTile > 1),
                "overlap mainloop: exactly one operand must carry per-row or per-column scales");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    using TileShape = typename Base::TileShape;
    using TiledMma = typename Base::TiledMma;
    using SmemLayoutSFA = typename Base::SmemLayoutSFA;
    using SmemLayoutSFB = typename Base::SmemLayoutSFB;

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    // The scales as (BLK_M, BLK_N, (BLK_K, PIPE)) views with zero strides along the broadcast mode,
    // so that partition_C gives each thread the scales of exactly its accumulator elements.
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                               make_shape(get<1>(shape(SmemLayoutSFA{})), get<2>(shape(SmemLayoutSFA{})))),
                    make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                make_stride(get<1>(stride(SmemLayoutSFA{})), get<2>(stride(SmemLayoutSFA{}))))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), get<0>(shape(SmemLayoutSFB{})),
                               make_shape(get<1>(shape(SmemLayoutSFB{})), get<2>(shape(SmemLayoutSFB{})))),
                    make_stride(_0{}, get<0>(stride(SmemLayoutSFB{})),
                                make_stride(get<1>(stride(SmemLayoutSFB{})), get<2>(stride(SmemLayoutSFB{}))))));

    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (MMA_K, PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // smem descriptors (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));

    // Per-stage scale registers: the per-row (or per-column) operand's scales, premultiplied by the
    // other operand's single block scale. Two sets, one per partial-sum fragment.
    auto& tCsScale = pick<kRowScales>(tCsSFA, tCsSFB);
    auto& tCsBlock = pick<kRowScales>(tCsSFB, tCsSFA);
    Tensor scale0 = make_tensor_like<ElementScale>(tCsScale(_, _, _, _0{}));
    Tensor scale1 = make_tensor_like<ElementScale>(tCsScale(_, _, _, _0{}));
    Tensor partial0 = make_fragment_like(accum);
    Tensor partial1 = make_fragment_like(accum);

    PipelineState smem_pipe_release = smem_pipe_read;

    // Waits for the next stage, reads its scales and issues its WGMMAs into `partial`.
    auto issue = [&](auto& partial, auto& scale) {
      auto token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, token);
      const int stage = smem_pipe_read.index();
      copy(tCsScale(_, _, _, make_coord(_0{}, stage)), scale);
      const ElementScale block_scale = tCsBlock(_0{}, _0{}, _0{}, make_coord(_0{}, stage));
      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
      // Runs while the WGMMAs do: the broadcast operand's block scale folded into the vector.
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(scale)); ++i) filter_zeros(scale)(i) *= block_scale;
      ++smem_pipe_read;
    };
    // Waits until at most `kInFlight` WGMMA batches are outstanding (so the batch that wrote
    // `partial` is done), frees its stage unless it is the last, and adds its scaled sums.
    auto promote = [&](auto& partial, auto& scale, auto in_flight, bool release) {
      warpgroup_wait<decltype(in_flight)::value>();
      warpgroup_fence_operand(partial);
      if (release) {
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) = fmaf(partial(i), scale(i), accum(i));
    };

    clear(accum);
    warpgroup_fence_operand(accum);
    issue(partial0, scale0);
    int k = 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      issue(partial1, scale1);
      promote(partial0, scale0, Int<1>{}, true);
      issue(partial0, scale0);
      promote(partial1, scale1, Int<1>{}, true);
    }
    if (k < k_tile_count) {
      issue(partial1, scale1);
      promote(partial0, scale0, Int<1>{}, true);
      promote(partial1, scale1, Int<0>{}, false);
    } else {
      promote(partial0, scale0, Int<0>{}, false);
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace qb::sm90
