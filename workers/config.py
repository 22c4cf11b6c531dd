"""Loading settings so that a misconfiguration stops the process with a clear message."""

from __future__ import annotations

from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from workers.errors import ConfigError

S = TypeVar("S", bound=BaseSettings)
# pydantic's prefix for the ValueError of a validator; one that checks several variables names them itself.
VALUE_ERROR_PREFIX = "Value error, "


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The environment variable that feeds ``field`` of settings class ``cls``."""
    info = cls.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, str):
        return info.validation_alias
    choices = getattr(info.validation_alias, "choices", None) if info is not None else None
    if choices and isinstance(choices[0], str):
        return choices[0]
    prefix = cls.model_config.get("env_prefix", "") or ""
    return f"{prefix}{field}".upper()


def load_settings(cls: type[S], **overrides: object) -> S:
    """Build ``cls`` from the environment; raise ``ConfigError`` naming each bad variable.

    pydantic names fields, operators know environment variables: the error names the
    variable and never echoes the value (it may be a secret).
    """
    try:
        return cls(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_input=False, include_url=False):
            if err["loc"]:
                problems.append(f"{env_name(cls, str(err['loc'][0]))}: {err['msg']}")
            else:  # a check across variables (a model validator): its message names them
                problems.append(err["msg"].removeprefix(VALUE_ERROR_PREFIX))
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
