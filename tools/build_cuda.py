"""Configure and build csrc_cuda with CMake; used by setup.py, noxfile.py and .ci/run.

    python tools/build_cuda.py [--archs "75;80;89;90a"] [--build-dir build/cuda] [--dest providers/_lib]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cutlass_root() -> str:
    import cutlass_library  # from the nvidia-cutlass wheel

    return str(Path(cutlass_library.__file__).resolve().parent / "source")


def build(source: Path, build_dir: Path, dest: Path, archs: str | None = None, jobs: int | None = None) -> Path:
    build_dir.mkdir(parents=True, exist_ok=True)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *generator,
                 "-DCMAKE_BUILD_TYPE=Release", f"-DQB_CUTLASS_DIR={cutlass_root()}",
                 f"-DPython3_EXECUTABLE={sys.executable}"]
    if archs:
        configure.append(f"-DQB_CUDA_ARCHS={archs}")
    subprocess.run(configure, check=True)
    jobs = jobs or int(os.environ.get("QBACKEND_BUILD_JOBS", os.cpu_count() or 2))
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(jobs)], check=True)
    built = next(build_dir.rglob("libqbackend_cuda.so"))
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, dest / built.name)
    return dest / built.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", default=os.environ.get("QBACKEND_CUDA_ARCHS"))
    parser.add_argument("--build-dir", default=str(ROOT / "build" / "cuda"))
    parser.add_argument("--dest", default=str(ROOT / "providers" / "_lib"))
    parser.add_argument("--jobs", type=int)
    args = parser.parse_args()
    out = build(ROOT / "csrc_cuda", Path(args.build_dir), Path(args.dest), args.archs, args.jobs)
    print(f"built {out}")


if __name__ == "__main__":
    main()
