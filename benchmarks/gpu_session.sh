#!/bin/bash
# Everything a session with a lent GPU runs, in one call (docs/performance.md, "The GPU table" and "The GPU
# ablation"; docs/phenaki.md, "On one GPU"). Parts, in the order they run (PARTS selects, default the first four):
#   check     the code path on the GPU in seconds: benchmarks/gpu_sampling.py --tiny (stops the call if it fails)
#   ablation  DiT-XL/2's step lever by lever, DiT-B/2, the reference's step, the loss curve (benchmarks/gpu_ablation.py)
#   sampling  DiT-XL/2 250-step DDPM with guidance, genforge beside the reference's loop (benchmarks/gpu_sampling.py)
#   video     the C-ViViT tokenizer and Phenaki trained on moving shapes, evaluated (benchmarks/gpu_video.py)
#   table     the earlier GPU table: benchmarks/gpu.py --compile, MaskGIT sampling
#   families  every family's debug preset compiled with Triton (benchmarks/compile_families.py)
#   cli       `genforge train dit-debug` in bf16, compiled, then `genforge sample --precision bf16 --compile`
# Outputs go to $OUT (default /tmp/gpu-out), one file per part.
#
#   REF=path/to/DiT bash benchmarks/gpu_session.sh
#   PARTS="ablation" ABLATION_S=300 bash benchmarks/gpu_session.sh
#   bash benchmarks/gpu_session.sh --tiny         # every selected part's --tiny path: the script checked on a CPU
# What the GPU machine lacks travels in the working tree, in folders git ignores: .whl/ (wheels, installed to
# /tmp/site), .ref/DiT (facebookresearch/DiT's models.py, diffusion/, sample_ddp.py), .gpu/minilm (Phenaki's MiniLM
# text encoder, fp16) and .gpu/cache (the shapes judge). Without PyAV (its wheel is too large to travel) a stand-in
# module lets genforge import: no video files are read or written there, GIFs and PNGs are (PIL).
# The wheels are not kept in the tree between sessions (their metadata lists extras this project must not name in
# a dependency file); fetch them into .whl/ before a GPU call, for the GPU image's Python (3.12 on the H200 used):
#   pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     -c constraints.txt pydantic pydantic-core annotated-types typing-extensions typing-inspection diffusers \
#     importlib-metadata webdataset braceexpand vector-quantize-pytorch einx frozendict loguru torch-einops-utils
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
REF=${REF:-.ref/DiT}
TINY=""; [[ ${1:-} == --tiny ]] && TINY="--tiny"
START=$SECONDS
if compgen -G ".whl/*.whl" >/dev/null && ! python3 -c "import pydantic, diffusers, webdataset, vector_quantize_pytorch" \
    2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
if ! python3 -c "import av" 2>/dev/null; then
  mkdir -p /tmp/site/av
  cat > /tmp/site/av/__init__.py <<'PY'
"""Stand-in for PyAV where it is not installed (benchmarks/gpu_session.sh): genforge imports, video files fail."""
class error:  # noqa: N801 - PyAV's module name
    FFmpegError = OSError
def open(*args, **kwargs):  # noqa: A001 - PyAV's name
    raise OSError("PyAV is not installed on this machine: no video files here")
PY
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[[ -d .gpu/cache ]] && export GENFORGE_CACHE=$PWD/.gpu/cache
MINILM=(); [[ -d .gpu/minilm ]] && MINILM=(--minilm "$PWD/.gpu/minilm")
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu-info.txt"
fi
python3 -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version(),
  torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU', 'CPUs', __import__('os').cpu_count())" \
  | tee -a "$OUT/gpu-info.txt"
PARTS=${PARTS:-check ablation sampling video}
say() { echo "== $1 done at $((SECONDS - START)) s (exit $2)" | tee -a "$OUT/gpu-info.txt"; }
if [[ $PARTS == *check* ]]; then
  timeout "${CHECK_S:-30}" python3 benchmarks/gpu_sampling.py --tiny --no-compile 2>&1 | tee "$OUT/check.txt"
  rc=$?; say check $rc; [[ $rc == 0 ]] || exit 1
fi
if [[ $PARTS == *ablation* ]]; then
  timeout "${ABLATION_S:-300}" python3 benchmarks/gpu_ablation.py --reference "$REF" --budget-s $((${ABLATION_S:-300} - 15)) \
    $TINY ${ABLATION_ARGS:-} 2>&1 | tee "$OUT/ablation.md"
  say ablation $?
fi
if [[ $PARTS == *sampling* ]]; then
  timeout "${SAMPLING_S:-65}" python3 benchmarks/gpu_sampling.py --reference "$REF" $TINY ${SAMPLING_ARGS:-} 2>&1 \
    | tee "$OUT/sampling.md"
  say sampling $?
fi
if [[ $PARTS == *video* ]]; then
  # writes $OUT/video.md and one GIF itself (its output is video.md's text: logged outside $OUT)
  timeout "${VIDEO_S:-180}" python3 benchmarks/gpu_video.py --budget-s $((${VIDEO_S:-180} - 25)) --out "$OUT" \
    "${MINILM[@]}" $TINY ${VIDEO_ARGS:-} 2>&1 | tee /tmp/gpu-video.log
  say video $?
fi
if [[ $PARTS == *table* ]]; then
  timeout "${TABLE_S:-330}" python3 benchmarks/gpu.py --compile --reference "$REF" $TINY ${GPU_ARGS:-} 2>&1 \
    | tee "$OUT/gpu.txt"
  say table $?
fi
if [[ $PARTS == *families* ]]; then
  timeout "${FAMILIES_S:-150}" python3 benchmarks/compile_families.py --repeats 3 ${FAMILIES_ARGS:-} 2>&1 \
    | tee "$OUT/families.txt"
  say families $?
fi
if [[ $PARTS == *cli* ]]; then
  run=/tmp/gpu-cli-run
  timeout "${CLI_S:-120}" python3 -m genforge train dit-debug --run-dir "$run" --set train.precision=bf16 \
    --set train.compile=true --set train.steps=200 > "$OUT/cli.txt" 2>&1
  echo "train exit $?; $(wc -l < "$OUT/cli.txt") lines"; tail -4 "$OUT/cli.txt"
  timeout 60 python3 -m genforge sample "$run" --precision bf16 --compile --n 16 --out "$OUT/cli-sample.png" \
    >> "$OUT/cli.txt" 2>&1
  say cli $?
fi
