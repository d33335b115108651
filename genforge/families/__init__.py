"""The families genforge trains. Adding one = a folder here, its config class in FAMILY_CONFIGS, a preset,
a docs page and a test module that reuses the shared contract test; the engine is not edited."""

from genforge.families.dit.config import DiTConfig
from genforge.families.dvae.config import DVAEConfig
from genforge.families.klvae.config import KLVAEConfig
from genforge.families.maskgit.config import MaskGITConfig
from genforge.families.vqgan.config import VQGANConfig

FAMILY_CONFIGS = (DiTConfig, DVAEConfig, KLVAEConfig, MaskGITConfig, VQGANConfig)
