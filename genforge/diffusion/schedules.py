"""Noise schedules β_t (DDPM, Ho et al. 2020; IDDPM, Nichol & Dhariwal 2021)."""

from __future__ import annotations

import numpy as np

SCHEDULES = ("linear", "cosine")


def beta_schedule(name: str, num_timesteps: int) -> np.ndarray:
    """β_0..β_{T−1} in float64: "linear" (DDPM §4, 1e-4 → 0.02, scaled by 1000/T as IDDPM does) or "cosine"
    (IDDPM eq. 17: ᾱ_t = f(t)/f(0), f(t) = cos²((t/T + s)/(1 + s)·π/2), s = 0.008; β_t = 1 − ᾱ_t/ᾱ_{t−1},
    clipped at 0.999)."""
    if num_timesteps < 1:
        raise ValueError(f"num_timesteps must be >= 1, got {num_timesteps}")
    if name == "linear":
        scale = 1000.0 / num_timesteps
        return np.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=np.float64)
    if name == "cosine":
        s = 0.008
        f = np.cos((np.arange(num_timesteps + 1, dtype=np.float64) / num_timesteps + s) / (1 + s) * np.pi / 2) ** 2
        return np.minimum(1.0 - f[1:] / f[:-1], 0.999)  # ratio of consecutive ᾱ = f(t)/f(t−1)
    raise ValueError(f"unknown noise schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
