"""Settings classes as command-line flags: one ``--flag`` per field, env GENFLEET_* as fallback."""

import argparse
from typing import TypeVar

from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def add_settings_arguments(parser: argparse.ArgumentParser, settings: type[BaseSettings]) -> None:
    """One flag per setting; a flag left out falls back to GENFLEET_* or the default."""
    for name, field in settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (env GENFLEET_{name.upper()})"
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, help=help_text)


def settings_from_args(args: argparse.Namespace, settings: type[S]) -> S:
    given = {
        name: getattr(args, name)
        for name in settings.model_fields
        if getattr(args, name, None) is not None
    }
    return settings(**given)
