"""RunConfig: model (a union discriminated by `family`) + data + train + eval + log."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field, model_validator

from genforge.config.base import (LOWER_IS_BETTER, METRIC_RESULTS, DataConfig, EvalConfig, LogConfig, StrictModel,
                                  TrainConfig)
from genforge.families import FAMILY_CONFIGS

ModelConfig = Annotated[Union[FAMILY_CONFIGS], Field(discriminator="family")]  # type: ignore[valid-type]


class RunConfig(StrictModel):
    """A complete, validated training run."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="default run directory name")
    description: str = ""
    model: ModelConfig
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        if self.eval.metrics is None:
            self.eval.metrics = list(self.model.default_metrics)
        if self.train.keep_best is not None:
            if not self.eval.every:
                raise ValueError("train.keep_best needs evaluation during training: set eval.every > 0")
            known = {name for metric in self.eval.metrics for name in METRIC_RESULTS[metric]}
            if self.train.keep_best not in known:
                raise ValueError(f"train.keep_best={self.train.keep_best!r} is not an evaluation result of "
                                 f"eval.metrics={self.eval.metrics}; allowed: {', '.join(sorted(known))}")
            if self.train.keep_best in LOWER_IS_BETTER and self.train.keep_best_mode != "min":
                raise ValueError(f"train.keep_best={self.train.keep_best}: lower is better; set "
                                 "train.keep_best_mode=min")
        self.model.check_run(self)
        return self
