#!/usr/bin/env bash
# Carry onnxruntime-gpu to a GPU machine that has only a CPU onnxruntime and no package index
# (the device machine of docs/cuda.md), in as few calls as its 64 MiB per call allows.
#
#   tools/gpu_carry.sh prepare [--full]
#       here: download onnxruntime-gpu 1.31.1 (CUDA 13, cp312, manylinux_2_28 x86_64: 244 MiB),
#       unpack it as an installed tree, drop the two libraries Python's CUDA EP never loads (the C
#       API's libonnxruntime.so and the TensorRT provider), zero every GPU architecture's code in
#       the CUDA provider but sm_$ARCH's (tools/fatbin_prune.py; ARCH=90 by default, the H200's and
#       H100's; --full keeps them all), and pack the tree as one tar.xz split into .ort/p0, .ort/p1,
#       ... of PART_MIB (52) MiB each, the last one smaller. For sm_90 that is two parts, 52 and
#       about 8 MiB, where the whole wheel took five. .ort is in .gitignore: only `carry` takes it.
#       WHEEL=path uses a wheel already here instead of downloading. The tree also holds the pure
#       Python packages the image has too old for this package ($EXTRA: onnx-ir 1.1; the image has
#       1.0.0, KINDS.md), so the fusion in the round runs what the tests here ran.
#   tools/gpu_carry.sh parts      the parts and their sizes
#   tools/gpu_carry.sh stash      there, in every call: copies what this call carried (.ort/p*,
#                                 build/gpu) to $STASH (/tmp/rmsnorm-carry), outside the checkout,
#                                 so a later call that carries other paths still finds them
#   tools/gpu_carry.sh assemble   there, once every part has arrived (carried now or stashed by an
#                                 earlier call): checks their SHA-256 and unpacks the tree into
#                                 $SITE (/tmp/ort-site); then PYTHONPATH=$SITE finds it before the
#                                 image's CPU onnxruntime
#
# The device tool sends the session's own checkout: run `prepare` there (the lead's checkout). A
# warm machine keeps /tmp for 30 s after a call, so the calls must follow each other at once; a
# machine given back in between starts bare. tools/gpu_round.sh stashes and assembles by itself.
#
# What onnxruntime-gpu needs besides: libcudart 13, cuBLAS(Lt), cuFFT, cuRAND, cuDNN 9 and NVRTC
# (its "cuda"/"cudnn" extras). The device image holds them as PyTorch's nvidia-* packages
# (/work/.library/device/KINDS.md), and gpu_round.sh puts them on LD_LIBRARY_PATH, so nothing else
# is carried. Its Python needs (numpy, protobuf, flatbuffers, packaging) are in the image too.
set -eu -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=1.31.1
arch=${ARCH:-90}
part_mib=${PART_MIB:-52}
extra=${EXTRA-onnx-ir==1.1.0}  # EXTRA= (empty): none
site=${SITE:-/tmp/ort-site}
stash=${STASH:-/tmp/rmsnorm-carry}
case "${1:-}" in
prepare)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if [ -n "${WHEEL:-}" ]; then
        cp "$WHEEL" "$work/"
    else
        ${PYTHON:-python3} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            -d "$work" "onnxruntime-gpu==$version"
    fi
    wheel=$(ls "$work"/onnxruntime_gpu-*.whl)
    mkdir "$work/site" "$work/extra" && (cd "$work/site" && unzip -q "$wheel")
    if [ -n "$extra" ]; then
        ${PYTHON:-python3} -m pip download -q --no-deps --only-binary=:all: -d "$work/extra" $extra
        for w in "$work"/extra/*.whl; do (cd "$work/site" && unzip -q -o "$w"); done
    fi
    capi=$work/site/onnxruntime/capi
    rm -f "$capi"/libonnxruntime.so* "$capi"/libonnxruntime_providers_tensorrt.so
    if [ "${2:-}" != --full ]; then
        ${PYTHON:-python3} "$repo/tools/fatbin_prune.py" "$capi/libonnxruntime_providers_cuda.so" \
            "$capi/libonnxruntime_providers_cuda.so" --keep "$arch"
    fi
    rm -rf "$repo/.ort" && mkdir -p "$repo/.ort"
    tar -C "$work/site" -cf - . | xz -T0 -6 | split -b "${part_mib}M" -d -a 1 - "$work/part"
    for f in "$work"/part?; do
        n=${f##*part}
        mkdir -p "$repo/.ort/p$n" && mv "$f" "$repo/.ort/p$n/part"
    done
    (cd "$repo/.ort" && sha256sum p*/part > p0/SHA256SUMS && basename "$wheel" > p0/WHEEL)
    "$0" parts
    ;;
parts)
    for d in "$repo"/.ort/p*; do echo "${d#"$repo"/} $(du -m "$d/part" | cut -f1) MiB"; done
    ;;
stash)
    mkdir -p "$stash/.ort" "$stash/build"
    for d in "$repo"/.ort/p*; do [ -d "$d" ] && cp -r "$d" "$stash/.ort/"; done
    [ -d "$repo/build/gpu" ] && cp -r "$repo/build/gpu" "$stash/build/"
    ls "$stash/.ort" "$stash/build" 2>/dev/null | tr '\n' ' '
    echo
    ;;
assemble)
    "$0" stash > /dev/null
    cd "$stash/.ort"
    sha256sum -c --quiet p0/SHA256SUMS
    rm -rf "$site" && mkdir -p "$site"
    # the parts the checksums name, in their order (a stale part of an older prepare is not one)
    unxz() { if command -v xz > /dev/null; then xz -d; else python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'; fi; }
    cat $(awk '{print $2}' p0/SHA256SUMS) | unxz | tar -C "$site" -xf -
    echo "$(cat p0/WHEEL) unpacked into $site"
    ;;
*)
    echo "usage: tools/gpu_carry.sh prepare [--full] | parts | stash | assemble" >&2
    exit 2
    ;;
esac
