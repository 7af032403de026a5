"""streamrt's layers (docs/architecture.md, "Layers"): every import a module makes at run time points to its own layer or below.

Imports under ``if TYPE_CHECKING:`` are annotations only and may point anywhere. A
higher layer serves a lower class through ``streamrt._extensions`` (provide/hook)
instead of an import. The package's ``__init__`` and ``__main__`` sit above every layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "streamrt"

#: The first component under ``streamrt`` of every module, by layer (1 is the bottom).
LAYERS: dict[int, tuple[str, ...]] = {
    1: ("_errors", "_native", "_backends", "_extensions", "_version", "_kernel_decl"),
    2: (
        "_buffer", "_allocator", "_event", "_event_pool", "_completion", "_hostcall", "_switch_interval", "_host_work",
        "_releaser", "_watchdog", "_graph_release", "_submitter",
    ),
    3: (
        "_stream", "_runtime", "_interop", "_peer", "_trace", "_trace_backend", "_tracer", "_ranges", "_trace_labels",
        "_trace_clocks", "_trace_pending", "_trace_records", "_trace_export", "_trace_report",
    ),
    4: ("_pipeline", "_streampool", "_kernel", "_scheduler"),
    5: ("torch", "recipes", "_cli"),
}
_TOP = 6  # streamrt/__init__.py and __main__.py
_LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int | None:
    """The layer of ``streamrt...`` module ``module`` (None: not streamrt's)."""
    parts = module.split(".")
    if parts[0] != "streamrt":
        return None
    if len(parts) == 1 or parts[1] == "__main__":
        return _TOP
    return _LAYER_OF.get(parts[1], 0)


def _runtime_imports(text: str, module: str, *, package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every streamrt import in ``text`` (module ``module``; ``package``: an
    ``__init__``) outside ``if TYPE_CHECKING:`` blocks."""
    base_parts = module.split(".") if package else module.split(".")[:-1]
    tree = ast.parse(text)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = base_parts[: len(base_parts) - (node.level - 1)]
                if node.module:
                    found.append((node.lineno, ".".join([*base, node.module])))
                else:  # `from . import x`: the module x, else the package's attribute x
                    found += [(node.lineno, _module_or_package([*base, a.name])) for a in node.names]
            elif node.module and node.module.split(".")[0] == "streamrt":
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "streamrt"]
    return found


def _module_or_package(parts: list[str]) -> str:
    """``a.b.x`` if that is a module of the tree, else ``a.b`` (``x`` is an attribute of the package)."""
    path = PACKAGE.parent.joinpath(*parts)
    return ".".join(parts if path.is_dir() or path.with_suffix(".py").exists() else parts[:-1])


def _upward(text: str, module: str, *, package: bool = False) -> list[str]:
    own = _layer(module) or 0
    return [f"line {line}: {target}" for line, target in _runtime_imports(text, module, package=package) if (_layer(target) or 0) > own]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    assert [str(p.relative_to(PACKAGE)) for p in MODULES if _layer(_module_name(p)) == 0] == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_points_to_a_higher_layer(path: Path) -> None:
    module = _module_name(path)
    assert _upward(path.read_text(), module, package=path.name == "__init__.py") == [], f"{module} (layer {_layer(module)})"


def test_the_check_finds_an_upward_import_in_a_function_and_skips_annotations() -> None:
    text = (
        "from typing import TYPE_CHECKING\n"
        "from ._errors import ClosedError\n"
        "if TYPE_CHECKING:\n"
        "    from ._runtime import Runtime\n"
        "def f():\n"
        "    from .torch import fetch\n"
        "    import streamrt._pipeline\n"
    )
    assert _upward(text, "streamrt._event") == ["line 6: streamrt.torch", "line 7: streamrt._pipeline"]
    assert _upward("from .. import _stream\n", "streamrt._completion._lane") == ["line 1: streamrt._stream"]
    assert _upward("from . import __version__\n", "streamrt._trace_export") == ["line 1: streamrt"]  # the package itself
