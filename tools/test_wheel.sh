#!/usr/bin/env bash
# Install a built qbackend wheel apart from this checkout and run tests against the installed package
# (its own libqbackend_cuda.so), not against the checkout.
#
#   bash tools/test_wheel.sh dist/qbackend-*.whl [pytest args...]
#
# Default tests: the CPU suite (tests/, GPU tests skip without a GPU); other pytest args replace it.
# TORCH_SPEC picks the torch next to it:
#   TORCH_SPEC="torch==2.13.0" (default)  a fresh venv: pip installs that torch and the wheel's test
#                                          extra (CI)
#   TORCH_SPEC=system                      the wheel goes into a folder put first on PYTHONPATH of this
#                                          machine's python3 (its torch, pytest and other packages, in
#                                          a venv or not); nothing is downloaded (the GPU machine)
# WHEEL_VENV is that venv or folder (default /tmp/qbackend-wheel-venv; it is recreated).
# Needs Python >= 3.11 (`python -P`).
set -euo pipefail
wheel=$(realpath "$1")
shift
cd "$(dirname "$0")/.."
venv=${WHEEL_VENV:-/tmp/qbackend-wheel-venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
# The wheel's own library is what is tested.
unset QBACKEND_CUDA_LIB

rm -rf "$venv"
if [ "$torch_spec" = system ]; then
  # Not a venv with --system-site-packages: that would see the base interpreter's packages, not those
  # of the venv the machine's torch may live in.
  python=python3
  python3 -m pip install -q --no-deps --no-index --target "$venv" "$wheel"
  python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$venv" ./tests/demo_provider
  export PYTHONPATH="$venv${PYTHONPATH:+:$PYTHONPATH}"
  site=$venv
else
  python3 -m venv "$venv"
  python="$venv/bin/python"
  "$python" -m pip install -q "$torch_spec"
  "$python" -m pip install -q "$wheel[test]"
  "$python" -m pip install -q --no-deps ./tests/demo_provider
  site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
fi

# -P: `python -m` would otherwise put this checkout (its qbackend/) first on sys.path.
# The installed package must be the one imported, with its own library.
WHEEL_SITE=$site "$python" -P - <<'PY'
import os
import sys

import torch

import qbackend
from qbackend_providers import native

print(f"wheel test: python {sys.version.split()[0]}, torch {torch.__version__}, qbackend from {qbackend.__file__}")
d = native.describe()
print(f"wheel test: libqbackend_cuda {'loaded' if d['loaded'] else 'NOT loaded'} from {d['found_in']}: "
      f"{d['path']}; archs {' '.join(d['archs'])}")
if not qbackend.__file__.startswith(os.environ["WHEEL_SITE"]) or not d["loaded"] or d["found_in"] != "package":
    sys.exit(f"wheel test: the installed package or its library is not the one in use ({d['error']})")
PY

if [ $# -eq 0 ]; then
  set -- tests
fi
"$python" -P -m pytest -q -p no:cacheprovider "$@"
