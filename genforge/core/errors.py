"""The error every layer raises for a config or input that cannot be used (the CLI exits with code 2)."""


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field, the value and what is allowed."""
