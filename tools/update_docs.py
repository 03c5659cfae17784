"""Regenerate the parts of the docs that are program output: the golden selection table inside
docs/selection.md (between its markers) and the `qbackend info --simulate sm_89` sample in
docs/getting-started.md.

    python tools/update_docs.py          # rewrite them
    python tools/update_docs.py --check  # exit 1 if a committed one is stale
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from qbackend.golden import BEGIN, END, markdown
from qbackend_providers.native import BUILD_HINT

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ROOT / "docs" / "selection.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
SAMPLE_COMMAND = "$ qbackend info --simulate sm_89\n"
# The sample shows a checkout at /src/qbackend without the native library, whatever the machine
# that regenerates it has (the library's line is the only one that depends on that).
SAMPLE_ROOT = "/src/qbackend"
NO_LIBRARY = (f"  libqbackend_cuda: not loaded; path {SAMPLE_ROOT}/providers/_lib/libqbackend_cuda.so; archs -  "
              f"(OSError: not found: {SAMPLE_ROOT}/providers/_lib/libqbackend_cuda.so or "
              "/home/user/.cache/qbackend/lib/libqbackend_cuda.so (run `qbackend build`, or set QBACKEND_CUDA_LIB))  "
              f"[counts as built for sm_89]\n    to build it: {BUILD_HINT}\n")


def info_sample() -> str:
    """What `qbackend info --simulate sm_89` prints with the built-in providers only."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("QBACKEND_PROVIDER", "QBACKEND_DISABLE", "QBACKEND_SIMULATE", "QBACKEND_CUDA_LIB")}
    env["QBACKEND_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    out = subprocess.run([sys.executable, "-m", "qbackend", "info", "--simulate", "sm_89"], env=env,
                         capture_output=True, text=True, check=True).stdout
    # The library's line and the lines under it (what to run, the last build's log).
    return re.sub(r"(?m)^  libqbackend_cuda: .*\n(    .*\n)*", lambda _: NO_LIBRARY, out)


def sample_span(text: str) -> tuple:
    """(start, stop) of the sample's output inside the getting-started page."""
    start = text.index("```console\n" + SAMPLE_COMMAND) + len("```console\n" + SAMPLE_COMMAND)
    return start, text.index("```", start)


def updated() -> dict:
    """{path: its text with the generated parts regenerated}."""
    selection = SELECTION.read_text()
    start, stop = selection.index(BEGIN), selection.index(END) + len(END)
    guide = GETTING_STARTED.read_text()
    s0, s1 = sample_span(guide)
    return {SELECTION: selection[:start] + markdown() + selection[stop:],
            GETTING_STARTED: guide[:s0] + info_sample() + guide[s1:]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for path, text in updated().items():
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        for path in stale:
            print(f"{path} is stale: run python tools/update_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
