#!/usr/bin/env bash
# Fetch the wheels benchmarks/gpu_check.sh may need on a GPU machine without network:
# autotm's dependencies for Python 3.12 on manylinux x86_64, into shared/wheels (which
# travels with the working tree to the device machine and is ignored by git).
#
# Run here, where pip reaches the package index:   bash benchmarks/gpu_wheels.sh
# The GPU image already holds torch, numpy, matplotlib, rich, typer, hypothesis, pytest and
# pytest-timeout (see the device README's package list); gpu_check.sh installs only what
# its Python cannot import, from this folder, without the network.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=shared/wheels
mkdir -p "$DEST"
PIP=(python3 -m pip)
if [ -x .venv/bin/python ]; then PIP=(.venv/bin/python -m pip); fi
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
COMMON=(download --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d "$DEST")
# with their dependencies (pure-Python ones come as py3-none-any wheels)
"${PIP[@]}" "${COMMON[@]}" highspy typer rich platformdirs hypothesis pytest pytest-timeout
# numpy and matplotlib only if asked: the GPU image has them, and they are large
if [ "${WITH_NUMPY_MATPLOTLIB:-0}" = 1 ]; then
    "${PIP[@]}" "${COMMON[@]}" numpy matplotlib
fi
du -sh "$DEST"
ls "$DEST"
