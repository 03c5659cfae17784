#!/usr/bin/env bash
# Install a built qbackend wheel into a fresh virtual environment and run tests against the installed
# package (its own libqbackend_cuda.so), not against this checkout.
#
#   bash tools/test_wheel.sh dist/qbackend-*.whl [pytest args...]
#
# Default tests: the CPU suite (tests/, GPU tests skip without a GPU); other pytest args replace it.
# TORCH_SPEC picks the torch next to it:
#   TORCH_SPEC="torch==2.13.0" (default)  pip installs that torch and the wheel's test extra (CI)
#   TORCH_SPEC=system                      the venv sees this machine's site-packages (its torch and
#                                          pytest) and nothing is downloaded (the GPU machine)
# WHEEL_VENV is the venv's path (default /tmp/qbackend-wheel-venv; it is recreated).
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
  python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
  "$venv/bin/python" -m pip install -q --no-deps --no-index --no-build-isolation ./tests/demo_provider
else
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "$torch_spec"
  "$venv/bin/python" -m pip install -q "$wheel[test]"
  "$venv/bin/python" -m pip install -q --no-deps ./tests/demo_provider
fi

# From a neutral directory: the installed package must be the one imported, with its library.
(cd / && "$venv/bin/python" - <<'EOF'
import sys

import torch

import qbackend
from qbackend_providers import native

print(f"wheel test: python {sys.version.split()[0]}, torch {torch.__version__}, qbackend from {qbackend.__file__}")
d = native.describe()
print(f"wheel test: libqbackend_cuda {'loaded' if d['loaded'] else 'NOT loaded'} from {d['found_in']}: {d['path']}; "
      f"archs {' '.join(d['archs'])}")
if not qbackend.__file__.startswith(sys.prefix) or not d["loaded"] or d["found_in"] != "package":
    sys.exit("wheel test: the installed package or its library is not the one in use")
EOF
)

# -I: a plain `python -m pytest` would put this checkout (its qbackend/) first on sys.path.
if [ $# -eq 0 ]; then
  set -- tests
fi
"$venv/bin/python" -I -m pytest -q -p no:cacheprovider "$@"
