#!/usr/bin/env bash
# Carry onnxruntime-gpu to a GPU machine that has only a CPU onnxruntime and no package index
# (the device machine of docs/cuda.md), in parts small enough for its 64 MiB per call.
#
#   tools/gpu_carry.sh prepare    here: download onnxruntime-gpu 1.31.1 (CUDA 13, cp312,
#                                 manylinux_2_28 x86_64: 255.6 MB, 244 MiB, of which its CUDA
#                                 provider library is 221 MiB zipped, 271 MiB unpacked; xz does not
#                                 shrink it enough to save a part) and split it into parts under
#                                 .ort/p0 .. .ort/p4 (< 55 MiB each; .ort is in
#                                 .gitignore, so only a call's `carry` takes it)
#   tools/gpu_carry.sh parts      prints the parts, one per call
#   tools/gpu_carry.sh assemble   there, once every part has arrived: joins them and installs the
#                                 wheel into /tmp/ort-site (then PYTHONPATH=/tmp/ort-site python3
#                                 finds it before the image's CPU onnxruntime)
#
# The device tool sends the session's own checkout: run `prepare` there (the lead's checkout).
# On the device, each call carries one part (carry: [".ort/pN"]): ignored paths that earlier
# calls brought stay there while the machine is warm (30 s after a call), so the calls must
# follow each other at once; a machine given back in between starts bare. The last call runs
# `tools/gpu_carry.sh assemble && tools/gpu_round.sh`.
#
# What onnxruntime-gpu needs besides: libcudart 13, cuBLAS(Lt), cuFFT, cuRAND, cuDNN 9 and NVRTC
# (its "cuda"/"cudnn" extras). The device image holds them as PyTorch's nvidia-* packages
# (nvidia-cuda-runtime, nvidia-cublas, nvidia-cufft, nvidia-curand, nvidia-cudnn-cu13,
# nvidia-cuda-nvrtc: /work/.library/device/KINDS.md), and onnxruntime.preload_dlls() loads them
# from there, so nothing else is carried. Its Python needs (numpy, protobuf, flatbuffers,
# packaging) are in the image too.
set -eu -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=1.31.1
part_mib=55
case "${1:-}" in
prepare)
    work=$(mktemp -d)
    ${PYTHON:-python3} -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        -d "$work" "onnxruntime-gpu==$version"
    rm -rf "$repo/.ort" && mkdir -p "$repo/.ort"
    split -b "${part_mib}M" -d -a 1 "$work"/onnxruntime_gpu-*.whl "$work/part"
    for f in "$work"/part*; do
        n=${f##*part}
        mkdir -p "$repo/.ort/p$n" && mv "$f" "$repo/.ort/p$n/part"
    done
    (cd "$repo/.ort" && sha256sum p*/part > SHA256SUMS && mv SHA256SUMS p0/ &&
        basename "$work"/onnxruntime_gpu-*.whl > p0/WHEEL)
    rm -rf "$work"
    "$0" parts
    ;;
parts)
    for d in "$repo"/.ort/p*; do echo "${d#"$repo"/} $(du -m "$d/part" | cut -f1) MiB"; done
    ;;
assemble)
    cd "$repo/.ort"
    sha256sum -c p0/SHA256SUMS
    rm -rf /tmp/ort-site /tmp/ort-wheel && mkdir -p /tmp/ort-wheel
    cat p*/part > "/tmp/ort-wheel/$(cat p0/WHEEL)"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ort-site \
        /tmp/ort-wheel/*.whl
    PYTHONPATH=/tmp/ort-site python3 -c "import onnxruntime as o; o.preload_dlls(); \
print(o.__version__, o.get_available_providers())"
    ;;
*)
    echo "usage: tools/gpu_carry.sh prepare|parts|assemble" >&2
    exit 2
    ;;
esac
