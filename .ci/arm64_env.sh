#!/usr/bin/env bash
# Sets up, once, what the ARM stage of CI needs to cross-build the engine for aarch64 and run it under qemu-user:
#   - the cross compiler (gcc-aarch64-linux-gnu) and qemu-user, from apt;
#   - an arm64 Python 3.11: Debian's arm64 packages fetched with `apt-get download` and unpacked with `dpkg -x`
#     into $ARM64_CACHE/root (run as `QEMU_LD_PREFIX=$ARM64_CACHE/root qemu-aarch64 $ARM64_CACHE/root/usr/bin/python3.11`);
#   - the aarch64 wheels of the Python dependencies the kernel and engine tests import, unzipped into
#     $ARM64_CACHE/site (pip refuses to install foreign wheels; that folder goes on PYTHONPATH);
#   - the arm64 Python's sysconfig data alone in $ARM64_CACHE/sysconfig, for the standard cross build.
# Everything is cached outside the checkout ($ARM64_CACHE, default /var/cache/bitnet-arm64): a second run only
# checks the stamp files. Usage: .ci/arm64_env.sh [PYTHON]  (PYTHON: the host's Python 3.11 with pip; default python).
set -euo pipefail
ARM64_CACHE="${ARM64_CACHE:-/var/cache/bitnet-arm64}"
PY="${1:-$(command -v python || command -v python3)}"
mkdir -p "$ARM64_CACHE"

if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    echo "== apt: gcc-aarch64-linux-gnu, qemu-user"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu qemu-user >/dev/null
fi

ROOT="$ARM64_CACHE/root"
if [ ! -f "$ROOT/.complete" ]; then
    echo "== arm64 Python 3.11 root in $ROOT (apt-get download + dpkg -x)"
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
    fi
    apt-get update -qq
    DEBS="$ARM64_CACHE/debs"
    mkdir -p "$DEBS"
    PKGS="python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11 libpython3.11 libpython3.11-dev
          libc6 libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1 libcrypt1 libncursesw6
          libtinfo6 libreadline8 libdb5.3 libgdbm6 libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3
          libkrb5support0 libcom-err2 libkeyutils1 libstdc++6 libgcc-s1"
    (cd "$DEBS" && for p in $PKGS; do ls "${p}"_*_arm64.deb >/dev/null 2>&1 || apt-get download -qq "$p:arm64"; done)
    rm -rf "$ROOT" && mkdir -p "$ROOT"
    for d in "$DEBS"/*_arm64.deb; do dpkg -x "$d" "$ROOT"; done
    touch "$ROOT/.complete"
fi

SC="$ARM64_CACHE/sysconfig"
if [ ! -f "$SC/_sysconfigdata__linux_aarch64-linux-gnu.py" ]; then
    mkdir -p "$SC"
    cp "$ROOT/usr/lib/python3.11/_sysconfigdata__linux_aarch64-linux-gnu.py" "$SC/"
fi

SITE="$ARM64_CACHE/site"
if [ ! -f "$SITE/.complete" ]; then
    echo "== aarch64 wheels into $SITE (pip download + unzip)"
    WHL="$ARM64_CACHE/wheels"
    mkdir -p "$WHL"
    "$PY" -m pip download -q --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_28_aarch64 --python-version 3.11 --only-binary=:all: -d "$WHL" \
        "numpy>=2.0" "tokenizers>=0.20" "safetensors>=0.4" "huggingface-hub>=1.0" "jinja2>=3.1" \
        "pytest>=8" "pytest-timeout>=2.3"
    rm -rf "$SITE" && mkdir -p "$SITE"
    for w in "$WHL"/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
    touch "$SITE/.complete"
fi
echo "arm64 environment ready in $ARM64_CACHE"
