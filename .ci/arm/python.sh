#!/usr/bin/env bash
# Run the sysroot's aarch64 CPython as a Cortex-A53:  python.sh SYSROOT [python args...]
# Extra import paths come from COINF_ARM_PATH (colon-separated), never from the host's site.
set -euo pipefail
sysroot=${1:?usage: python.sh SYSROOT ARGS...}
shift
export PYTHONNOUSERSITE=1
export PYTHONPATH=${COINF_ARM_PATH:-}
export OMP_NUM_THREADS=1
exec qemu-aarch64-static -L "$sysroot" -cpu cortex-a53 "$sysroot/usr/bin/python3.11" -s "$@"
