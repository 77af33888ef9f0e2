"""Settings classes as command-line flags: one ``--flag`` per field, made from its definition.

For a settings class (``BaseSettings``) a flag left out falls back to the
environment variable GENFLEET_* and then to the field's default; for a plain
model (``EngineConfig`` in ``genfleet generate``) to the default.
"""

import argparse
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_settings import BaseSettings

M = TypeVar("M", bound=BaseModel)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    settings: type[BaseModel],
    only: Iterable[str] | None = None,
) -> None:
    """One flag per field of ``settings`` (or of those named in ``only``)."""
    from_env = issubclass(settings, BaseSettings)
    wanted = set(settings.model_fields if only is None else only)
    for name, field in settings.model_fields.items():
        if name not in wanted:
            continue
        help_text = field.description or ""
        if from_env:
            help_text += f" (env GENFLEET_{name.upper()})"
        if field.annotation is bool:
            parser.add_argument(_flag(name), action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(_flag(name), help=help_text)


def given_settings(args: argparse.Namespace, settings: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``settings`` whose flags were given (a command without a field's flag
    gives none)."""
    return {
        name: getattr(args, name)
        for name in settings.model_fields
        if getattr(args, name, None) is not None
    }


def settings_from_args(args: argparse.Namespace, settings: type[M]) -> M:
    return settings(**given_settings(args, settings))


def as_flags(values: Mapping[str, Any]) -> list[str]:
    """Settings as the flags that give them, to pass on to another command."""
    flags: list[str] = []
    for name, value in values.items():
        if isinstance(value, bool):
            flags.append(_flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            if isinstance(value, BaseModel):
                value = value.model_dump()
            text = json.dumps(value) if isinstance(value, dict) else str(value)
            flags += [_flag(name), text]
    return flags
