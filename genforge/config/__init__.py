"""Typed configs: presets shipped as YAML, user YAML files and `--set key=value` overrides, all validated
by the same pydantic models before any model or data is built.

Names are loaded on first use so that family config modules can import `genforge.config.base` while the
run config (which lists the families) imports them: no import cycle.
"""

from typing import Any

__all__ = ["ConfigError", "RunConfig", "DEFAULT_PRESET", "list_presets", "load_config", "parse_overrides",
           "to_yaml", "format_validation_error"]


def __getattr__(name: str) -> Any:
    if name == "RunConfig":
        from genforge.config.run import RunConfig

        return RunConfig
    if name in __all__:
        from genforge.config import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'genforge.config' has no attribute {name!r}")
