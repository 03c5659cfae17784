"""tools/marlin_sass.py on hand-written listings: which reads of a read-only load it counts as early."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import marlin_sass  # noqa: E402

LISTING = """
        Function : _ZN8qbmarlin4kern16marlin_mm_kernelILi1ELb1ELi80ELi3EEEvNS0_6ParamsE
        /*0000*/                   LDG.E.CONSTANT R4, desc[UR4][R2.64] ;      /* 0x0000000000000000 */
        /*0010*/                   LDG.E.CONSTANT R5, desc[UR4][R2.64+0x4] ;  /* 0x0000000000000000 */
        /*0020*/              @!P0 FMUL R6, R4, 256 ;                         /* 0x0000000000000000 */
        /*0030*/                   MOV R5, R7 ;                               /* 0x0000000000000000 */
        /*0040*/                   FADD R8, R5, R5 ;                          /* 0x0000000000000000 */
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;              /* 0x0000000000000000 */
        /*0060*/                   FMUL R9, R4, R4 ;                          /* 0x0000000000000000 */
        Function : _ZN8qbmarlin4kern16marlin_mm_kernelILi4ELb0ELi80ELi0EEEvNS0_6ParamsE
        /*0000*/                   EXIT ;                                     /* 0x0000000000000000 */
"""


def test_listing_is_split_by_kernel_instance():
    kernels = marlin_sass.sass_by_instance(LISTING)
    assert sorted(kernels) == ["MT1 bf16 S3", "MT4 fp16 S0"]
    assert kernels["MT1 bf16 S3"][2] == "@!P0 FMUL R6, R4, 256"
    assert kernels["MT4 fp16 S0"] == ["EXIT"]


def test_reads_before_the_barrier_count_and_overwritten_or_later_ones_do_not():
    kernels = marlin_sass.sass_by_instance(LISTING)
    # the predicated-off FMUL reads R4 (counted); MOV overwrites R5, so the FADD's reads are not of the
    # load; the FMUL after the barrier reads R4 once the load is waited for there
    assert marlin_sass.early_reads(kernels["MT1 bf16 S3"]) == 1
    assert marlin_sass.early_reads(kernels["MT4 fp16 S0"]) == 0
