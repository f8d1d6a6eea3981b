#!/usr/bin/env bash
# The GPU checks of the trainer and the predictor, as one short
# script for a CUDA machine:
#   1. the CUDA tests of the split backward (side streams, events; gradients against
#      autograd), the loader (pinned buffers, copy stream) and the trainer (resume);
#   2. ResNet-50 iteration time, autograd vs split backward, batch 64 and 256, fp32 and
#      bf16 (autocast), one GPU;
#   3. the predictor's GPU calibration and validation (below).
# Results go to ${OUT:-.}/backward-gpu.json and predict-gpu*.json (record them in
# docs/benchmarks.md).
# Needs a Python with a CUDA build of torch and torchvision; installs dlbooster itself
# without dependencies into that environment.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
python -c "import torch, torchvision; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
python -m pip install --quiet --no-deps --no-build-isolation -e . >/dev/null
python -m pytest -q -p no:cacheprovider tests/host/train/test_schedule.py tests/host/runtime/test_loader_gpu.py tests/host/train/test_train.py -k cuda
dlbooster bench backward --device cuda --model resnet50 --batch-size 64,256 --dtype fp32,bf16 \
    --iterations 10 --rounds 3 --warmup 3 --json "$out/backward-gpu.json"
# 3. The iteration-time predictor on this GPU: its CUDA test, a calibrated GPU
#    profile, and measured against predicted iterations of the validation's 8 CNNs at
#    224x224, batch 32, 64 and 128, one GPU (fp32); also against the shipped profile
#    named by $SHIPPED (e.g. h100) when set.
python -m pytest -q -p no:cacheprovider tests/host/predict/test_predict.py -k cuda
export DLBOOSTER_CACHE="${DLBOOSTER_CACHE:-$out/cache}"
dlbooster predict calibrate --device cuda
dlbooster predict validate --device cuda --batch-sizes 32,64,128 --image-size 224 --iterations 10 \
    --rounds 2 --quiet --json "$out/predict-gpu.json"
if [ -n "${SHIPPED:-}" ]; then
    dlbooster predict validate --device "$SHIPPED" --batch-sizes 32,64,128 --image-size 224 --iterations 10 \
        --quiet --json "$out/predict-gpu-$SHIPPED.json"
fi
