"""Checks of what a user hands the ``streamrt`` command: files, folders, backends.

Each check raises :class:`CommandError` with a message that names the option
and says what is wrong; :func:`streamrt._cli.main` prints it as
``streamrt <command>: error: <message>`` and exits with status 2. The commands
run these checks before any long work starts, so a mistake costs nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["CommandError", "load_profile", "open_runtime_for", "output_dir", "output_file", "read_json"]


class CommandError(Exception):
    """A mistake in a command line or in the files it names (not a bug in streamrt): exit status 2."""


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def output_dir(path: str, option: str = "--out-dir") -> str:
    """Create the folder ``path`` (and its parents) if needed; ``CommandError`` when it cannot be or is not writable."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CommandError(f"{option} {path!r} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"{option} {path!r} cannot be created: {_why(exc)}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {path!r} is not writable")
    return path


def output_file(path: str, option: str) -> str:
    """Check that the file ``path`` can be written: its folder is created if needed; ``path`` must not be a folder."""
    if os.path.isdir(path):
        raise CommandError(f"{option} {path!r} is a directory, not a file")
    output_dir(os.path.dirname(path) or ".", option=f"{option} {path!r}: the folder")
    return path


def read_json(path: str, option: str) -> Any:
    """The JSON document in the file ``path``; ``CommandError`` when it cannot be read or is not JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError as exc:
        raise CommandError(f"{option} {path!r}: no such file") from exc
    except IsADirectoryError as exc:
        raise CommandError(f"{option} {path!r} is a directory, not a file") from exc
    except OSError as exc:
        raise CommandError(f"{option} {path!r} cannot be read: {_why(exc)}") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CommandError(f"{option} {path!r} is not a JSON file: {exc}") from exc


def load_profile(path: str, option: str = "--profile") -> Any:
    """The :class:`~streamrt._backends.sim.SimProfile` in the JSON file ``path``; ``CommandError`` when it is not one."""
    from .._backends.sim import SimProfile

    data = read_json(path, option)
    try:
        return SimProfile.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"{option} {path!r} is not a simulator profile: {exc}") from exc


def open_runtime_for(backend: str, device: int = 0, **options: Any) -> Any:
    """``open_runtime(backend, device, **options)``, with a device index that does not exist as a ``CommandError``.

    A backend that cannot be used here raises ``BackendUnavailableError`` (what is missing and
    how to get it), which the command line reports as a user error too.
    """
    from .._runtime import open_runtime

    try:
        return open_runtime(backend, device, **options)
    except ValueError as exc:  # open_runtime checks its arguments: the device index, the options
        raise CommandError(str(exc)) from exc
