"""clip: a small contrastive image-text model (CLIP), the offline image embedder of the DALL·E 2 decoder."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.clip.config import ClipConfig

register_family(ClipConfig, "genforge.families.clip.task:ClipTask", Path(__file__).parent / "presets")
