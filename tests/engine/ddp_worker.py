"""Run under torchrun (or plainly, for 1 process): train dit-debug (or the preset GENFORGE_TEST_PRESET), then
every rank saves its weights and buffers (and its EMA).

GENFORGE_TEST_FAULT=no_steps makes every rank train no step (its weights and EMA as the run starts);
GENFORGE_TEST_FAULT=kill|hang makes rank 1 die (SIGKILL) or hang at step 3, for the failure tests;
GENFORGE_TEST_FAULT=diverge makes rank 1 nudge one weight at step 1 (the consistency check must name it);
GENFORGE_TEST_FAULT=kill_in_shards makes rank 1 die (SIGKILL) while writing its shards of the checkpoint of step 4
(train.sharding=fsdp); GENFORGE_TEST_FAULT=nan_once gives rank 1 a NaN loss the first time it meets steps 3 and 4.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.engine import state as state_module
from genforge.engine import trainer as trainer_module
from genforge.engine.sharding import whole
from genforge.families.diffusion.task import DiffusionTask

fault = os.environ.get("GENFORGE_TEST_FAULT")
if fault == "no_steps":  # every rank builds and loads, then trains nothing (what a run starts with)
    trainer_module.Trainer._loop = lambda self, stop, stop_at: None
elif fault == "kill_in_shards" and os.environ.get("RANK") == "1":
    plain_save = state_module.save_shards

    def dying_save(folder, tensors):
        if folder.parent.name.endswith("step-000004"):
            os.kill(os.getpid(), signal.SIGKILL)
        plain_save(folder, tensors)

    state_module.save_shards = dying_save
elif fault and os.environ.get("RANK") == "1":
    plain = DiffusionTask.loss
    seen: set[int] = set()

    def faulty(self, batch, phase, step):
        if fault == "diverge" and step == 1:
            with torch.no_grad():
                self.model.final_layer.linear.bias.add_(1e-3)
        elif fault == "nan_once":
            value, extra = plain(self, batch, phase, step)
            first_time = step in (3, 4) and step not in seen
            seen.add(step)
            return (value * float("nan") if first_time else value), extra
        elif step == 3:
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        return plain(self, batch, phase, step)

    DiffusionTask.loss = faulty

run_dir, out_dir, *overrides = sys.argv[1:]
trainer = make_trainer(load_config(os.environ.get("GENFORGE_TEST_PRESET", "dit-debug"), overrides), Path(run_dir))
trainer.fit()
rank = trainer.accelerator.process_index
state = {k: whole(v).detach().cpu().contiguous() for k, v in trainer.task.state_dict().items()}
save_file(state, str(Path(out_dir) / f"rank{rank}-of{trainer.accelerator.num_processes}.safetensors"))
shadow = {k: whole(v).detach().cpu().contiguous() for k, v in trainer.state.ema.state_dict().items()}
save_file(shadow, str(Path(out_dir) / f"ema-rank{rank}-of{trainer.accelerator.num_processes}.safetensors"))
if torch.distributed.is_initialized():  # as genforge train does: leave the process group before exiting
    torch.distributed.destroy_process_group()
