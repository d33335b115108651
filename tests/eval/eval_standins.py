"""Cheap stand-ins for evaluation tests: a feature network that counts its calls, and a generator."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from genforge.core.task import Batch, Task
from genforge.core.config import SampleOptions


class TinyFeatures:
    """`features.PoolFeatures` without a network: 4x4 average-pooled pixels [B, 48] (a fixed random projection
    to `dim` when asked); deterministic, and it counts the images it saw."""

    def __init__(self, dim: int = 48, input_rule: str = "4x4 average pool of uint8 / 255") -> None:
        self.dim, self.input_rule, self.images = dim, input_rule, 0
        self.projection = torch.randn(48, dim, generator=torch.Generator().manual_seed(0)) if dim != 48 else None

    def pool(self, images: Tensor) -> Tensor:
        assert images.dtype == torch.uint8
        self.images += len(images)
        pooled = F.adaptive_avg_pool2d(images.float() / 255, 4).flatten(1)
        return pooled if self.projection is None else (pooled @ self.projection).relu()

    def fingerprint(self) -> dict[str, Any]:
        return {"network": f"tiny stand-in {self.dim}-d", "input": self.input_rule}


class NoiseGenerator(Task):
    """A class-conditional "generator": uniform noise images drawn from the generator it is given."""

    def __init__(self, size: int = 16) -> None:
        super().__init__()
        self.size = size

    def sample_conditions(self, n: int, generator: torch.Generator, options: SampleOptions) -> Batch:
        return Batch(label=torch.arange(n) % 16)

    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: SampleOptions,
               progress: bool = False) -> Tensor:
        return torch.rand(n, 3, self.size, self.size, generator=generator) * 2 - 1


class NoisyCopier(Task):
    """A "variation" model: each sample is its source image (`cond["image"]`) plus Gaussian noise of std `sigma`."""

    def __init__(self, sigma: float, size: int = 16) -> None:
        super().__init__()
        self.sigma, self.size = sigma, size

    def sample_conditions(self, n: int, generator: torch.Generator, options: SampleOptions) -> Batch:
        return Batch(image=torch.rand(n, 3, self.size, self.size, generator=torch.Generator().manual_seed(1)) * 1.6 - 0.8)

    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: SampleOptions,
               progress: bool = False) -> Tensor:
        noise = torch.randn(cond["image"].shape, generator=generator, device=generator.device)
        return cond["image"] + self.sigma * noise
