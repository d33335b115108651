"""Noise schedules β_t (DDPM, Ho et al. 2020; IDDPM, Nichol & Dhariwal 2021)."""

from __future__ import annotations

import math

import numpy as np

SCHEDULES = ("linear", "cosine")


def beta_schedule(name: str, num_timesteps: int) -> np.ndarray:
    """β_1..β_T in float64: "linear" (DDPM's 1e-4..0.02, scaled by 1000/T as IDDPM does) or "cosine"
    (IDDPM eq. 17: ᾱ_t = f(t)/f(0), f(t) = cos²((t/T + s)/(1 + s)·π/2), s = 0.008, β clipped at 0.999)."""
    if name == "linear":
        scale = 1000 / num_timesteps
        return np.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=np.float64)
    if name == "cosine":
        s = 0.008
        steps = np.arange(num_timesteps + 1, dtype=np.float64) / num_timesteps
        alpha_bar = np.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
        return np.minimum(1 - alpha_bar[1:] / alpha_bar[:-1], 0.999)
    raise ValueError(f"unknown noise schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
