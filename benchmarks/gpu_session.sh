#!/bin/bash
# Everything a session with a lent GPU runs, in one call (docs/performance.md, "The GPU table"):
#   1. the code path on the GPU: benchmarks/gpu.py --tiny (seconds; stops here if it fails);
#   2. the GPU table: DiT-XL/2 and B/2 eager, compiled and facebookresearch/DiT's step (a checkout in $REF),
#      MaskGIT sampling at batch 1 and 32;
#   3. every family's debug preset compiled with inductor's Triton backend (benchmarks/compile_families.py).
# Outputs go to $OUT (default /tmp/gpu-out): tiny.txt, gpu.txt, families.txt.
#
#   REF=path/to/DiT bash benchmarks/gpu_session.sh
# Wheels of packages the machine lacks may wait in .whl/ (installed to /tmp/site first).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
REF=${REF:-.ref/DiT}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu-info.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  | tee -a "$OUT/gpu-info.txt"
timeout "${TINY_S:-90}" python3 benchmarks/gpu.py --tiny 2>&1 | tee "$OUT/tiny.txt" || exit 1
timeout "${TABLE_S:-330}" python3 benchmarks/gpu.py --compile --reference "$REF" ${GPU_ARGS:-} 2>&1 | tee "$OUT/gpu.txt"
timeout "${FAMILIES_S:-150}" python3 benchmarks/compile_families.py --repeats 3 2>&1 | tee "$OUT/families.txt"
