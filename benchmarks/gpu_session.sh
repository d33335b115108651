#!/bin/bash
# What a session with a lent GPU runs (docs/performance.md, "The GPU session"; docs/phenaki.md, "On one GPU"). Parts,
# in the order they run (PARTS selects; default "check ablation sampling video", about 10 minutes):
#   check     the code path on the GPU in seconds: benchmarks/gpu_sampling.py --tiny (stops the call if it fails)
#   ablation  DiT-XL/2's step lever by lever, DiT-B/2, the reference's step, the loss curve (benchmarks/gpu_ablation.py)
#   profile   torch.profiler over DiT-XL/2's compiled step: top kernels, shares by category (benchmarks/gpu_profile.py)
#   sampling  DiT-XL/2 250-step DDPM with guidance, genforge beside the reference's loop (benchmarks/gpu_sampling.py)
#   video     the C-ViViT tokenizer and Phenaki trained on moving shapes, evaluated (benchmarks/gpu_video.py)
#   table     the earlier GPU table: benchmarks/gpu.py --compile, MaskGIT sampling
#   families  every family's debug preset compiled with Triton (benchmarks/compile_families.py)
#   cli       `genforge train dit-debug` in bf16, compiled, then `genforge sample --precision bf16 --compile`
# Each part runs under `timeout` with its own limit, PART_S seconds (CHECK_S 30, ABLATION_S 300, PROFILE_S 240,
# SAMPLING_S 65, VIDEO_S 180, TABLE_S 330, FAMILIES_S 150, CLI_S 180), and PART_ARGS passes it more arguments.
# Everything lands in $OUT (default /tmp/gpu-out) as it is produced, so a call cut at any point (a part's limit, the
# device tool's) returns every finished row: $OUT/session.log (the machine, each part's start and exit), and per part
# $OUT/PART.log (its whole output, appended line by line) and $OUT/PART.md (its tables, appended row by row; video:
# video.md rewritten every 15 s, and a GIF at its end; cli: cli-sample.png).
#
# One call per part (the device tool's run: timeout_s = the part's limit + 60 s for the start and the wheels):
#   PARTS="check ablation" ABLATION_S=500 bash benchmarks/gpu_session.sh       # run(timeout_s=600)
#   PARTS=profile PROFILE_S=300 bash benchmarks/gpu_session.sh                 # run(timeout_s=360)
#   PARTS=sampling SAMPLING_S=120 bash benchmarks/gpu_session.sh               # run(timeout_s=180)
#   PARTS=video VIDEO_S=540 bash benchmarks/gpu_session.sh                     # run(timeout_s=600)
#   PARTS=table TABLE_S=400 bash benchmarks/gpu_session.sh                     # run(timeout_s=460)
#   bash benchmarks/gpu_session.sh --tiny     # every selected part's --tiny path, eager: the script checked on a CPU
#
# Before the call, on the CPU side: `bash benchmarks/gpu_prepare.sh` writes what the GPU machine lacks into folders
# git ignores, which the call carries (run(carry=[".whl", ".ref", ".gpu"])): .whl/ (wheels, installed here to
# /tmp/site), .ref/DiT (facebookresearch/DiT's models.py, diffusion/, sample_ddp.py; REF= another checkout),
# .gpu/minilm (Phenaki's MiniLM text encoder, fp16) and .gpu/cache (the shapes judge, where genforge ships none).
# Without PyAV (its wheel is too large to travel) a stand-in module lets genforge import: no video files are read or
# written there, GIFs and PNGs are (PIL). PYTHON= the interpreter (default python3).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
REF=${REF:-.ref/DiT}
PY=${PYTHON:-python3}
TINY=(); EAGER=(); COMPILE=(--compile)
if [[ ${1:-} == --tiny ]]; then TINY=(--tiny); EAGER=(--no-compile); COMPILE=(); fi
START=$SECONDS
log() { echo "$*" | tee -a "$OUT/session.log"; }
NEEDS="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ['pydantic', 'diffusers',
  'webdataset', 'vector_quantize_pytorch']))"
if ! "$PY" -c "$NEEDS"; then  # the GPU image: .whl/'s wheels in /tmp/site (kept while the machine stays warm)
  if ! PYTHONPATH=/tmp/site "$PY" -c "$NEEDS"; then
    if ! compgen -G ".whl/*.whl" >/dev/null; then
      log "no wheels in .whl/: run benchmarks/gpu_prepare.sh before the call, and carry .whl"; exit 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      2>&1 | tee -a "$OUT/session.log" || exit 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c "import av" 2>/dev/null; then
  mkdir -p /tmp/site/av
  cat > /tmp/site/av/__init__.py <<'PY'
"""Stand-in for PyAV where it is not installed (benchmarks/gpu_session.sh): genforge imports, video files fail."""
class error:  # noqa: N801 - PyAV's module name
    FFmpegError = OSError
def open(*args, **kwargs):  # noqa: A001 - PyAV's name
    raise OSError("PyAV is not installed on this machine: no video files here")
PY
  [[ ${PYTHONPATH:-} == /tmp/site* ]] || export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[[ -d .gpu/cache ]] && export GENFORGE_CACHE=$PWD/.gpu/cache
MINILM=(); [[ -d .gpu/minilm ]] && MINILM=(--minilm "$PWD/.gpu/minilm")
REFERENCE=(); [[ -f $REF/models.py ]] && REFERENCE=(--reference "$REF")
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$OUT/session.log"
fi
"$PY" -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version(),
  torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU', 'CPUs', __import__('os').cpu_count())" \
  2>&1 | tee -a "$OUT/session.log"
PARTS=${PARTS:-check ablation sampling video}
has() { [[ " $PARTS " == *" $1 "* ]]; }
[[ ${#REFERENCE[@]} -gt 0 ]] || log "no facebookresearch/DiT checkout at $REF (benchmarks/gpu_prepare.sh): its rows not run"

# part NAME LIMIT_S COMMAND...: COMMAND under `timeout` (SIGTERM at LIMIT_S, SIGKILL 20 s later), its output appended
# to $OUT/NAME.log as it comes; the start and the exit status in session.log. Returns COMMAND's status.
# --foreground keeps COMMAND in this script's process group: whatever ends the call (a kill of the group) ends it too.
part() {
  local name=$1 limit=$2 rc; shift 2
  log "== $name: up to $limit s, from $((SECONDS - START)) s: $*"
  timeout --foreground -k 20 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  rc=$?
  log "== $name done at $((SECONDS - START)) s (exit $rc$( [[ $rc == 124 ]] && echo ": stopped at its limit"))"
  return $rc
}

if has check; then
  part check "${CHECK_S:-30}" "$PY" benchmarks/gpu_sampling.py --tiny --no-compile --report "$OUT/check.md" \
    ${CHECK_ARGS:-} || exit 1
fi
if has ablation; then
  s=${ABLATION_S:-300}
  part ablation "$s" "$PY" benchmarks/gpu_ablation.py "${REFERENCE[@]}" --budget-s $((s - 15)) --report \
    "$OUT/ablation.md" "${TINY[@]}" "${EAGER[@]}" ${ABLATION_ARGS:-}
fi
if has profile; then
  part profile "${PROFILE_S:-240}" "$PY" benchmarks/gpu_profile.py --report "$OUT/profile.md" "${TINY[@]}" \
    ${PROFILE_ARGS:-}
fi
if has sampling; then
  part sampling "${SAMPLING_S:-65}" "$PY" benchmarks/gpu_sampling.py "${REFERENCE[@]}" --report "$OUT/sampling.md" \
    "${TINY[@]}" "${EAGER[@]}" ${SAMPLING_ARGS:-}
fi
if has video; then
  # writes $OUT/video.md (rewritten as the runs go) and one GIF itself
  s=${VIDEO_S:-180}
  part video "$s" "$PY" benchmarks/gpu_video.py --budget-s $((s - 25)) --out "$OUT" --snapshot-s 15 "${MINILM[@]}" \
    "${TINY[@]}" ${VIDEO_ARGS:-}
fi
if has table; then
  part table "${TABLE_S:-330}" "$PY" benchmarks/gpu.py "${REFERENCE[@]}" --report "$OUT/table.md" "${COMPILE[@]}" \
    "${TINY[@]}" ${GPU_ARGS:-}
fi
if has families; then
  families=(--repeats 3); [[ ${#TINY[@]} -gt 0 ]] && families=(--repeats 1 --only dvae-debug)
  part families "${FAMILIES_S:-150}" "$PY" benchmarks/compile_families.py "${families[@]}" ${FAMILIES_ARGS:-}
fi
if has cli; then
  # train, then sample what it trained, within CLI_S; genforge writes cli.log line by line
  s=${CLI_S:-180} run=/tmp/gpu-cli-run
  train=(--set train.precision=bf16 --set train.compile=true --set train.steps=200) sample=(--precision bf16 --compile)
  if [[ ${#TINY[@]} -gt 0 ]]; then
    train=(--set train.precision=no --set train.compile=false --set train.steps=2) sample=(--precision no)
  fi
  rm -rf "$run"
  part cli $((s * 2 / 3)) "$PY" -m genforge train dit-debug --run-dir "$run" "${train[@]}" ${CLI_ARGS:-}
  part cli $((s / 3)) "$PY" -m genforge sample "$run" "${sample[@]}" --n 16 --out "$OUT/cli-sample.png"
fi
log "== session done at $((SECONDS - START)) s"
