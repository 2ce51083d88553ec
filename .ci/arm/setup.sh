#!/usr/bin/env bash
# Build (once, cached) an aarch64 CPython 3.11 + the wearable's wheels that run under qemu
# user-mode emulation as a Cortex-A53 (the Pi Zero 2 W's core). apt and pip only; nothing arm64 is
# installed into /: the sysroot comes from a private apt configuration, unpacked with dpkg -x.
#
#   .ci/arm/setup.sh REQUIREMENTS_FILE    -> prints the path of an env file to source
#
# PIP_PYTHON: the Python whose pip downloads the wheels (default python3).
#
# Cache: $COINF_ARM_CACHE (default ~/.cache/coinf-arm); the sysroot is keyed by this script, the
# site-packages by this script + the requirements, so reruns cost seconds.
set -euo pipefail

req=${1:?usage: setup.sh REQUIREMENTS_FILE}
cache=${COINF_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/coinf-arm}
here=$(cd "$(dirname "$0")" && pwd)
log() { printf 'arm-setup: %s\n' "$*" >&2; }

script_sum=$(cksum <"$here/setup.sh" | cut -d' ' -f1)
req_sum=$(cat "$here/setup.sh" "$req" | cksum | cut -d' ' -f1)
sysroot=$cache/sysroot-$script_sum
site=$cache/site-$req_sum
wheels=$cache/wheels
mkdir -p "$cache"

# 1. qemu-user-static (host package).
if ! command -v qemu-aarch64-static >/dev/null; then
    log "installing qemu-user-static (apt)"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-user-static >/dev/null
fi

# 2. The aarch64 sysroot (Debian bookworm = Raspberry Pi OS bookworm: Python 3.11, glibc 2.36).
if [ ! -e "$sysroot/.done" ]; then
    log "building the arm64 sysroot in $sysroot"
    rm -rf "$sysroot" "$cache/apt"
    apt=$cache/apt
    mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/etc" "$apt/debs"
    : >"$apt/state/status"
    key=/usr/share/keyrings/debian-archive-keyring.gpg
    cat >"$apt/etc/sources.list" <<SRC
deb [arch=arm64 signed-by=$key] http://deb.debian.org/debian bookworm main
deb [arch=arm64 signed-by=$key] http://deb.debian.org/debian bookworm-updates main
deb [arch=arm64 signed-by=$key] http://deb.debian.org/debian-security bookworm-security main
SRC
    cat >"$apt/apt.conf" <<CONF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Etc::SourceList "$apt/etc/sources.list";
Dir::Etc::SourceParts "$apt/etc/none";
APT::Get::List-Cleanup "false";
APT::Install-Recommends "false";
APT::Sandbox::User "root";
CONF
    export APT_CONFIG=$apt/apt.conf
    apt-get update -qq
    pkgs=(python3.11-minimal libpython3.11-stdlib libstdc++6 libgcc-s1 zlib1g)
    # The closure an install would need, downloaded (not installed) and unpacked.
    mapfile -t closure < <(apt-get -s install "${pkgs[@]}" | awk '/^Inst /{print $2}')
    log "downloading ${#closure[@]} arm64 packages"
    (cd "$apt/debs" && apt-get download -qq "${closure[@]}")
    mkdir -p "$sysroot"
    for deb in "$apt/debs"/*.deb; do dpkg -x "$deb" "$sysroot"; done
    # qemu passes the host's x86 /proc/cpuinfo through; onnxruntime's cpuinfo library segfaults on
    # it. qemu -L serves sysroot paths first, so describe four Cortex-A53 cores (a Pi Zero 2 W).
    mkdir -p "$sysroot/proc"
    for i in 0 1 2 3; do
        printf 'processor\t: %s\nBogoMIPS\t: 38.40\nFeatures\t: fp asimd evtstrm crc32 cpuid\n' "$i"
        printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n'
        printf 'CPU part\t: 0xd03\nCPU revision\t: 4\n\n'
    done >"$sysroot/proc/cpuinfo"
    "$here/python.sh" "$sysroot" -c 'import sys, platform; print(sys.version.split()[0], platform.machine())' >&2
    rm -rf "$apt"
    touch "$sysroot/.done"
fi

# 3. aarch64 wheels for cp311 (manylinux up to glibc 2.36), installed into a private site dir.
tags=(--only-binary=:all: --python-version 3.11 --implementation cp
      --abi cp311 --abi abi3 --abi none --platform manylinux2014_aarch64)
for n in $(seq 17 36); do tags+=(--platform "manylinux_2_${n}_aarch64"); done
pip=("${PIP_PYTHON:-python3}" -m pip --disable-pip-version-check)
if [ ! -e "$site/.done" ]; then
    log "downloading aarch64 cp311 wheels for $(tr '\n' ' ' <"$req")"
    rm -rf "$site"
    "${pip[@]}" download -q "${tags[@]}" -d "$wheels" -r "$req"
    "${pip[@]}" install -q --root-user-action=ignore --no-index --find-links "$wheels" \
        "${tags[@]}" --target "$site" -r "$req"
    touch "$site/.done"
fi

# 4. A runtime known to crash on the A53 (the negative control: the emulation must catch it).
bad=$cache/bad-onnxruntime-1.21.0
if [ ! -e "$bad/.done" ]; then
    log "downloading onnxruntime 1.21.0 (aarch64), known to die with SIGILL on a Cortex-A53"
    rm -rf "$bad"
    "${pip[@]}" download -q --no-deps "${tags[@]}" -d "$wheels" onnxruntime==1.21.0
    "${pip[@]}" install -q --root-user-action=ignore --no-index --no-deps --find-links "$wheels" \
        "${tags[@]}" --target "$bad" onnxruntime==1.21.0
    touch "$bad/.done"
fi

env_file=$cache/env-$req_sum.sh
cat >"$env_file" <<ENV
export COINF_ARM_SYSROOT=$sysroot
export COINF_ARM_SITE=$site
export COINF_ARM_PYTHON="$here/python.sh"
export COINF_ARM_BAD_SITE=$bad
ENV
echo "$env_file"
