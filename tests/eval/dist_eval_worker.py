"""Run under torchrun (or plainly, for 1 process): score a stand-in generator with fid, kid and prdc on stand-in
features; every rank writes `<out>-rank<r>.json` with its results and the number of images it featurised."""

import json
import os
import sys

import torch.distributed as dist

from eval_standins import NoiseGenerator, TinyFeatures
from genforge.app.config import load_config
from genforge.eval import metrics as metrics_module
from genforge.eval import run as run_module

out = sys.argv[1]
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")
net = TinyFeatures()
metrics_module.feature_network = lambda device: net
cfg = load_config("dit-debug", ["eval.ref_n=12"])  # reference: 12 held-out shapes, in batches of 4
results = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid", "kid", "prdc"], n=14, seed=3, device="cpu",
                                   batch_size=4)
rank = dist.get_rank() if dist.is_initialized() else 0
with open(f"{out}-rank{rank}.json", "w") as file:
    json.dump({"images": net.images, "results": results}, file)
if dist.is_initialized():
    dist.destroy_process_group()
