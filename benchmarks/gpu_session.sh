#!/bin/bash
# Everything a session with a lent GPU runs, in one call (docs/performance.md, "The GPU table"):
#   1. the code path on the GPU: benchmarks/gpu.py --tiny (seconds; stops here if it fails);
#   2. the GPU table: DiT-XL/2 and B/2 eager, compiled and facebookresearch/DiT's step (a checkout in $REF),
#      MaskGIT sampling at batch 1 and 32;
#   3. every family's debug preset compiled with inductor's Triton backend (benchmarks/compile_families.py);
#   4. the CLI: `genforge train dit-debug` in bf16, compiled, its output redirected (the log a cluster job gets),
#      then `genforge sample --precision bf16 --compile` of that run.
# Outputs go to $OUT (default /tmp/gpu-out): tiny.txt, gpu.txt, families.txt, cli.txt, cli-sample.png.
#
#   REF=path/to/DiT bash benchmarks/gpu_session.sh            # all four
#   PARTS="families cli" bash benchmarks/gpu_session.sh       # some of them (parts: tiny table families cli)
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
PARTS=${PARTS:-tiny table families cli}
if [[ $PARTS == *tiny* ]]; then
  timeout "${TINY_S:-90}" python3 benchmarks/gpu.py --tiny 2>&1 | tee "$OUT/tiny.txt" || exit 1
fi
if [[ $PARTS == *table* ]]; then
  timeout "${TABLE_S:-330}" python3 benchmarks/gpu.py --compile --reference "$REF" ${GPU_ARGS:-} 2>&1 | tee "$OUT/gpu.txt"
fi
if [[ $PARTS == *families* ]]; then
  timeout "${FAMILIES_S:-150}" python3 benchmarks/compile_families.py --repeats 3 ${FAMILIES_ARGS:-} 2>&1 | tee "$OUT/families.txt"
fi
if [[ $PARTS == *cli* ]]; then
  run=/tmp/gpu-cli-run
  timeout "${CLI_S:-120}" python3 -m genforge train dit-debug --run-dir "$run" --set train.precision=bf16 \
    --set train.compile=true --set train.steps=200 > "$OUT/cli.txt" 2>&1
  echo "train exit $?; $(wc -l < "$OUT/cli.txt") lines"; tail -4 "$OUT/cli.txt"
  timeout 60 python3 -m genforge sample "$run" --precision bf16 --compile --n 16 --out "$OUT/cli-sample.png" \
    >> "$OUT/cli.txt" 2>&1
  echo "sample exit $?"; tail -2 "$OUT/cli.txt"
fi
