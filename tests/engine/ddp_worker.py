"""Run under torchrun (or plainly, for 1 process): train dit-debug, then every rank saves its weights."""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from genforge.config import load_config
from genforge.engine.trainer import Trainer

run_dir, out_dir, *overrides = sys.argv[1:]
trainer = Trainer(load_config("dit-debug", overrides), Path(run_dir))
trainer.fit()
rank = trainer.accelerator.process_index
state = {k: v.detach().cpu().contiguous() for k, v in trainer.task.state_dict().items()}
save_file(state, str(Path(out_dir) / f"rank{rank}-of{trainer.accelerator.num_processes}.safetensors"))
