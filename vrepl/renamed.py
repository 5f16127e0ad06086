"""Settings that were renamed, and their old spellings, still accepted.

Limits are named in one order, `max_<what>_<unit>` (STYLE.md: the bound first, the unit last,
as `max_record_bytes` and the `--max-...` flags read). Settings spelled the other way were
renamed; an old name keeps working everywhere it was documented (node.toml, the settings
classes' keyword arguments, reading the attribute) with a one-line RenamedSetting warning
naming the new one.

Owns: `renamed_settings()` (the decorator of a settings dataclass), `new_keywords()` (a
call's old keywords to new ones), `use_new_names()` (a table's old keys to new ones) and `print_one_line()` (how the `vrepl` command shows the
warning). Must not: know any particular setting (each settings class lists its own).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, Mapping, TypeVar

from vrepl.errors import ConfigError, RenamedSetting

T = TypeVar("T", bound=type)


def warn_renamed(old: str, new: str, where: str = "", stacklevel: int = 3) -> None:
    warnings.warn(f"{where}{old} is now {new} (the old name is deprecated)", RenamedSetting, stacklevel=stacklevel)


def renamed_settings(renames: Mapping[str, str]) -> Callable[[T], T]:
    """Class decorator of a settings dataclass: `Cls(old=v)` sets the new field (with a
    warning) and `x.old` reads it. `Cls.RENAMED` is the {old: new} map, for parsers of files
    that name the settings and for `new_keywords()` (dataclasses.replace() takes new names)."""

    def decorate(cls: T) -> T:
        init = vars(cls)["__init__"]  # the dataclass's own, generated one

        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            init(self, *args, **new_keywords(cls, kw))

        __init__.__doc__ = init.__doc__
        cls.__init__ = __init__  # type: ignore[misc]
        for old, new in renames.items():
            setattr(cls, old, _alias(new))
        cls.RENAMED = dict(renames)  # type: ignore[attr-defined]
        return cls

    return decorate


def _alias(new: str) -> property:
    """A read-only attribute that reads `new` (what an old name of a setting reads)."""

    def read(self: Any) -> Any:
        return getattr(self, new)

    return property(read, doc=f"Formerly the name of `{new}` (deprecated).")


def new_keywords(cls: type, kw: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `cls` with old names of renamed settings made new (a warning
    each); TypeError when both names of one setting are given."""
    renames: Mapping[str, str] = getattr(cls, "RENAMED", {})
    out = dict(kw)
    for old, new in renames.items():
        if old in out:
            if new in out:
                raise TypeError(f"{cls.__name__}: {old} and {new} are one setting; give {new}")
            warn_renamed(old, new, f"{cls.__name__}: ", stacklevel=4)
            out[new] = out.pop(old)
    return out


def use_new_names(
    table: Mapping[str, Any], renames: Mapping[str, str], section: str = "", context: str = ""
) -> tuple[dict[str, Any], dict[str, str]]:
    """`table` (a file's `section`, e.g. "vnode.") with old keys replaced by new ones, a
    warning for each (prefixed with `context`, e.g. the file's path), and {new: old} for the
    keys that were given by their old name (so an error can name what was written)."""
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in table.items():
        new = renames.get(key)
        if new is None:
            out[key] = value
            continue
        if new in table:
            raise ConfigError(f"{section}{key} and {section}{new} are one setting; give {section}{new}")
        warn_renamed(section + key, section + new, context, stacklevel=4)
        out[new] = value
        given_as[new] = key
    return out, given_as


def print_one_line(prog: str) -> None:
    """Show RenamedSetting warnings as `<prog>: warning: <message>` on stderr (one line, as
    the command's errors); other warnings as before."""
    previous = warnings.showwarning
    if getattr(previous, "vrepl_prog", None) == prog:
        return  # already installed (main() called again in-process)

    def show(
        message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None
    ) -> None:
        if issubclass(category, RenamedSetting):
            print(f"{prog}: warning: {message}", file=sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    show.vrepl_prog = prog  # type: ignore[attr-defined]
    warnings.showwarning = show
