"""
Go's ``flag`` package syntax, so nsqtw's daemons take NSQ's command lines as written.

Accepted forms, as Go accepts them: ``-flag``, ``--flag`` (booleans),
``-flag=value``, ``--flag=value``, ``-flag value``, ``--flag value``;
repeatable flags collect every value; parsing stops at ``--`` or the first
non-flag argument.  ``--config file.toml`` loads NSQ's config file, whose
keys are the flags' config names; flags given on the command line win.

Go quirks kept on purpose: an empty ``--tls-min-version`` (flag or config)
leaves the default, as Go's ``Set("")`` does; unknown config-file keys are
ignored with a warning (Go ignores them silently); a daemon's deprecated
flags that nsqtw has no field for (nsqd's ``--worker-id``) are accepted and
ignored with a warning.  The apps' options classes (``nsqtw.tools``) reuse
the same parser without ``--config`` (``config_flag=False``).
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar
from collections.abc import Callable, Mapping

import attr

from ..options import (
    BOOL, FLOATLIST, STRLIST, TLS_MIN_VERSION, TLS_REQUIRED_KIND, OptionError, display_default, option_fields,
    options_from_strings,
)

__all__ = ["parse_go_flags", "options_from_argv", "usage_text", "HelpRequested", "VersionRequested",
           "FlagSyntaxError", "load_config_file"]

T = TypeVar("T")

_BOOL_KINDS = (BOOL, TLS_REQUIRED_KIND)


class HelpRequested(Exception):
    pass


class VersionRequested(Exception):
    pass


class FlagSyntaxError(OptionError):
    """The command line itself is wrong (unknown flag, missing value): Go exits 2 with usage."""


def _warn_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")


def _field_by_flag(cls: type) -> dict[str, attr.Attribute[Any]]:
    return {f.metadata["flag"]: f for f in option_fields(cls)}


def parse_go_flags(cls: type, argv: list[str], *, config_flag: bool = True,
                   ignored: Mapping[str, str] | None = None,
                   warn: Callable[[str], None] | None = None) -> tuple[dict[str, Any], str | None, list[str]]:
    """
    Parse ``argv`` Go-style against the flags of options class ``cls``.

    Returns ``(values by flag name, config file or None, remaining args)``;
    raises HelpRequested, VersionRequested or FlagSyntaxError (an OptionError).
    ``ignored`` maps deprecated flag names to their kind: they are parsed,
    reported through ``warn`` and dropped.
    """
    ignored = ignored or {}
    fields = _field_by_flag(cls)
    values: dict[str, Any] = {}
    config: str | None = None
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
            raise FlagSyntaxError(f"bad flag syntax: {arg}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        i += 1
        if name in ("h", "help"):
            raise HelpRequested()
        if name == "version":
            if value is None or value.lower() in ("1", "t", "true"):
                raise VersionRequested()
            continue
        if name == "config" and config_flag:
            if value is None:
                if i >= len(argv):
                    raise FlagSyntaxError("flag needs an argument: -config")
                value = argv[i]
                i += 1
            config = value
            continue
        field = fields.get(name)
        if field is None and name in ignored:
            kind = ignored[name]
        elif field is None:
            raise FlagSyntaxError(f"flag provided but not defined: -{name}")
        else:
            kind = field.metadata["kind"]
        if value is None:
            if kind in _BOOL_KINDS:
                value = "true"
            else:
                if i >= len(argv):
                    raise FlagSyntaxError(f"flag needs an argument: -{name}")
                value = argv[i]
                i += 1
        if field is None:
            (warn or _warn_stderr)(f"WARNING: --{name} is deprecated and ignored")
            continue
        if kind == TLS_MIN_VERSION and value.strip() == "":
            continue  # Go: Set("") keeps the default
        if kind in (STRLIST, FLOATLIST):
            values.setdefault(name, []).append(value)
        else:
            values[name] = value
    return values, config, argv[i:]


def load_config_file(path: str) -> dict[str, Any]:
    # imported only when a --config file is given (start-up time counts)
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10 has no tomllib: tomli is the same parser (a dependency there)
        import tomli as tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise OptionError(f"failed to load config file {path} - {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise OptionError(f"failed to load config file {path} - {e}") from None


def _config_keys(cls: type) -> dict[str, str]:
    """Every key a config file may use for ``cls`` -> its flag name."""
    keys: dict[str, str] = {}
    for f in attr.fields(cls):
        flag = f.metadata.get("flag")
        if not flag:
            continue
        for key in (f.name, flag, flag.replace("-", "_"), f.metadata.get("cfg")):
            if key:
                keys[key] = flag
    return keys


def config_values(cls: type, doc: Mapping[str, Any], warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A loaded config file's values that ``cls`` knows, Go's way: unknown keys are ignored
    (with a warning here), an empty ``tls_min_version`` means the default."""
    keys = _config_keys(cls)
    kinds = {f.metadata["flag"]: f.metadata["kind"] for f in option_fields(cls)}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        flag = keys.get(key) or keys.get(key.replace("-", "_"))
        if flag is None:
            (warn or _warn_stderr)(f"WARNING: config file key {key!r} is not an option of this daemon; ignored")
            continue
        if kinds.get(flag) == TLS_MIN_VERSION and isinstance(value, str) and not value.strip():
            continue
        out[key] = value
    return out


def options_from_argv(cls: type[T], argv: list[str], *, config_flag: bool = True,
                      ignored: Mapping[str, str] | None = None,
                      warn: Callable[[str], None] | None = None, **overrides: Any) -> T:
    """An options object from a Go-style command line (config file first, flags win)."""
    values, config, rest = parse_go_flags(cls, argv, config_flag=config_flag, ignored=ignored, warn=warn)
    if rest:
        raise FlagSyntaxError(f"unexpected argument: {rest[0]}")
    merged: dict[str, Any] = {}
    if config:
        merged.update(config_values(cls, load_config_file(config), warn))
    merged.update(values)
    return options_from_strings(cls, merged, **overrides)


def usage_text(cls: type, prog: str, *, config_flag: bool = True) -> str:
    """Help in the layout of Go's ``flag.PrintDefaults``."""
    lines = [f"Usage of {prog}:"]
    entries = [("config", "string", "path to config file", "")] if config_flag else []
    entries.append(("version", "", "print version string", ""))
    for f in option_fields(cls):
        kind = f.metadata["kind"]
        typ = {"bool": "", "int": "int", "duration": "duration", "str": "string", "float": "float",
               "strlist": "value", "floatlist": "value", "tls_required": "",
               "tls_min_version": "value", "log_level": "value", "node_id": "int"}.get(kind, "value")
        # attrs' stubs make Factory a function; at run time it is the class of f.default
        default = f.default.factory() if isinstance(f.default, attr.Factory) else f.default  # type: ignore[arg-type,union-attr]  # see above
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
