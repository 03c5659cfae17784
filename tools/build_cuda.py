"""The same as `qbackend build` (kept for scripts that call it); the logic is in providers/cuda_build.py.

    python tools/build_cuda.py [--archs all|native|"75;80;89;90a"] [--jobs N] [--build-dir DIR] [--dest DIR]
"""
import sys

from qbackend.cli import main

if __name__ == "__main__":
    sys.exit(main(["build", *sys.argv[1:]]))
