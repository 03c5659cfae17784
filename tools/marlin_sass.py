"""Static checks on the marlin kernels' machine code, from two standalone builds
(csrc_cuda/marlin/build_standalone.sh OUT_DIR) or one; needs cuobjdump and ptxas on PATH.

    python tools/marlin_sass.py same OLD_DIR NEW_DIR   # per kernel instance: the same instructions?
    python tools/marlin_sass.py early-reads DIR        # per instance: epilogue loads read before a barrier

Machine code is looked at in three forms: the sm_80 and sm_75 code built into the objects, and the
sm_90 code ptxas makes from the compute_80 PTX (what the driver runs on Hopper). `early-reads` counts,
in the sm_90 code, instructions that read the register of a 32-bit read-only load (LDG.E.CONSTANT:
the epilogue's scales and bias pairs) before a barrier, fence or exit has come between: such a read
makes the warp wait for the load there (see kLateOperandReads in marlin_kernel.cuh).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

INSTANCE = re.compile(r"marlin_mm_kernelILi(\d)ELb(\d)ELi(\d+)ELi(\d)E")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def sass_by_instance(listing: str) -> dict[str, list[str]]:
    """{'MT4 bf16 S0': [instruction, ...]} for each marlin_mm_kernel in a cuobjdump -sass listing."""
    kernels: dict[str, list[str]] = {}
    for part in re.split(r"\n\s+Function : ", listing)[1:]:
        m = INSTANCE.search(part.split("\n", 1)[0])
        if m:
            name = f"MT{m[1]} {'bf16' if m[2] == '1' else 'fp16'} S{m[4]}"
            kernels[name] = [" ".join(i.split()) for i in INSTRUCTION.findall(part)]
    return kernels


def sm90_from_ptx(obj: Path, tmp: Path) -> str:
    ptx = run("cuobjdump", "-ptx", str(obj))
    ptx = ptx[ptx.index(".version"):]
    ptx = ptx[: ptx.index("\nFatbin")] if "\nFatbin" in ptx else ptx
    (tmp / "k.ptx").write_text(ptx)
    run("ptxas", "-arch=sm_90", str(tmp / "k.ptx"), "-o", str(tmp / "k.cubin"))
    return run("cuobjdump", "-sass", str(tmp / "k.cubin"))


def forms(build: Path) -> dict[str, dict[str, list[str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        return {
            "sm_80": sass_by_instance(run("cuobjdump", "-sass", str(build / "marlin_sm80.o"))),
            "sm_75": sass_by_instance(run("cuobjdump", "-sass", str(build / "marlin_sm75.o"))),
            "sm_90 from PTX": sass_by_instance(sm90_from_ptx(build / "marlin_sm80.o", Path(tmp))),
        }


def early_reads(instructions: list[str]) -> int:
    pending: set[str] = set()  # registers a read-only load is still filling
    count = 0
    for ins in instructions:
        ins = re.sub(r"^@!?U?P\w+\s+", "", ins)  # a predicated-off read waits all the same
        op, _, args = ins.partition(" ")
        if op.startswith(("BAR.SYNC", "MEMBAR", "EXIT")):
            pending.clear()
            continue
        regs = re.findall(r"\bR(\d+)\b", args)
        if op.startswith("LDG.E.CONSTANT"):
            pending.add(regs[0])
            continue
        writes = bool(regs) and not op.startswith(("ST", "BRA", "BSYNC", "BSSY", "RED", "ATOM"))
        count += sum(r in pending for r in (regs[1:] if writes else regs))
        if writes:
            pending.discard(regs[0])
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    same = sub.add_parser("same")
    same.add_argument("old", type=Path)
    same.add_argument("new", type=Path)
    early = sub.add_parser("early-reads")
    early.add_argument("build", type=Path)
    args = ap.parse_args()
    if args.cmd == "same":
        old, new = forms(args.old), forms(args.new)
        for form, kernels in old.items():
            verdicts = [f"{k}: {'same' if new[form].get(k) == v else 'differs'}" for k, v in sorted(kernels.items())]
            print(f"{form}: " + "; ".join(verdicts))
    else:
        kernels = forms(args.build)["sm_90 from PTX"]
        print("; ".join(f"{k}: {early_reads(v)}" for k, v in sorted(kernels.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
