"""
Go's ``flag`` package syntax, so nsqtw's daemons take NSQ's command lines as written.

Accepted forms, as Go accepts them: ``-flag``, ``--flag`` (booleans),
``-flag=value``, ``--flag=value``, ``-flag value``, ``--flag value``;
repeatable flags collect every value; parsing stops at ``--`` or the first
non-flag argument.  ``--config file.toml`` loads NSQ's config file, whose
keys are the flags' config names; flags given on the command line win.
"""

from __future__ import annotations

import sys
import tomllib
from typing import Any, Dict, List, Optional, Tuple, Type, TypeVar

import attr

from ..options import (
    BOOL, FLOATLIST, STRLIST, TLS_REQUIRED, OptionError, display_default, option_fields,
    options_from_strings,
)

__all__ = ["parse_go_flags", "options_from_argv", "usage_text", "HelpRequested", "VersionRequested"]

T = TypeVar("T")

_BOOL_KINDS = (BOOL, TLS_REQUIRED)


class HelpRequested(Exception):
    pass


class VersionRequested(Exception):
    pass


def _field_by_flag(cls: type) -> Dict[str, "attr.Attribute[Any]"]:
    return {f.metadata["flag"]: f for f in option_fields(cls)}


def parse_go_flags(cls: type, argv: List[str]) -> Tuple[Dict[str, Any], Optional[str], List[str]]:
    """
    Parse ``argv`` Go-style against the flags of options class ``cls``.

    Returns ``(values by flag name, config file or None, remaining args)``;
    raises HelpRequested, VersionRequested or OptionError.
    """
    fields = _field_by_flag(cls)
    values: Dict[str, Any] = {}
    config: Optional[str] = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if len(arg) < 2 or not arg.startswith("-"):
            break
        name = arg[2:] if arg.startswith("--") else arg[1:]
        if not name or name.startswith("-") or name.startswith("="):
            raise OptionError(f"bad flag syntax: {arg}")
        value: Optional[str] = None
        if "=" in name:
            name, value = name.split("=", 1)
        i += 1
        if name in ("h", "help"):
            raise HelpRequested()
        if name == "version":
            if value is None or value.lower() in ("1", "t", "true"):
                raise VersionRequested()
            continue
        if name == "config":
            if value is None:
                if i >= len(argv):
                    raise OptionError("flag needs an argument: -config")
                value = argv[i]
                i += 1
            config = value
            continue
        field = fields.get(name)
        if field is None:
            raise OptionError(f"flag provided but not defined: -{name}")
        kind = field.metadata["kind"]
        if value is None:
            if kind in _BOOL_KINDS:
                value = "true"
            else:
                if i >= len(argv):
                    raise OptionError(f"flag needs an argument: -{name}")
                value = argv[i]
                i += 1
        if kind in (STRLIST, FLOATLIST):
            values.setdefault(name, []).append(value)
        else:
            values[name] = value
    return values, config, argv[i:]


def load_config_file(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise OptionError(f"failed to load config file {path} - {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise OptionError(f"failed to load config file {path} - {e}") from None


def options_from_argv(cls: Type[T], argv: List[str], **overrides: Any) -> T:
    """An options object from a Go-style command line (config file first, flags win)."""
    values, config, rest = parse_go_flags(cls, argv)
    if rest:
        raise OptionError(f"unexpected argument: {rest[0]}")
    merged: Dict[str, Any] = {}
    if config:
        merged.update(load_config_file(config))
    merged.update(values)
    return options_from_strings(cls, merged, **overrides)


def usage_text(cls: type, prog: str) -> str:
    """Help in the layout of Go's ``flag.PrintDefaults``."""
    lines = [f"Usage of {prog}:"]
    entries = [("config", "string", "path to config file", "")]
    entries.append(("version", "", "print version string", ""))
    for f in option_fields(cls):
        kind = f.metadata["kind"]
        typ = {"bool": "", "int": "int", "duration": "duration", "str": "string",
               "strlist": "value", "floatlist": "value", "tls_required": "",
               "tls_min_version": "value", "log_level": "value"}[kind]
        default = f.default.factory() if isinstance(f.default, attr.Factory) else f.default  # type: ignore[attr-defined]
        shown = display_default(f, default)
        entries.append((f.metadata["flag"], typ, f.metadata["help"], shown))
    for name, typ, help_text, default in sorted(entries):
        head = f"  -{name}" + (f" {typ}" if typ else "")
        tail = help_text
        if default not in ("", "0", "false", "0s", "[]"):
            tail += f' (default "{default}")' if typ == "string" else f" (default {default})"
        lines.append(head)
        lines.append(f"    \t{tail}")
    return "\n".join(lines) + "\n"
