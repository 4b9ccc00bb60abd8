"""The layers import downwards only: core imports neither shell nor kit, shell not kit
(nor either of them the stand-in server, `monitor.testing`).

Read from the source (AST), so an import under `if TYPE_CHECKING:` or inside a function
counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "monitor"
FORBIDDEN = {
    "monitor.core": ("monitor.shell", "monitor.kit", "monitor.testing"),
    "monitor.shell": ("monitor.kit", "monitor.testing"),
}


def imported_modules(path: Path, top: Path) -> list[tuple[int, str]]:
    """Every module `path` (under the package directory `top`) imports, by line, relative
    imports resolved."""
    package = ".".join(path.relative_to(top.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from monitor import kit` imports monitor.kit.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            found.append((node.lineno, base))
    return sorted(set(found))


def violations(layer: str, top: Path = PACKAGE) -> list[str]:
    root = top.joinpath(*layer.split(".")[1:])
    banned = FORBIDDEN[layer]
    return [
        f"{path.relative_to(top.parent)}:{line} imports {module}"
        for path in sorted(root.rglob("*.py"))
        for line, module in imported_modules(path, top)
        if any(module == ban or module.startswith(ban + ".") for ban in banned)
    ]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    assert violations(layer) == []


def test_the_check_sees_imports_under_type_checking_and_relative_ones(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from monitor.shell.watch import Watch\n"
        "def later():\n"
        "    from ...kit import demo\n"
        "from monitor import shell\n"
    )
    top = tmp_path / "monitor"
    (top / "core" / "rules").mkdir(parents=True)
    (top / "core" / "rules" / "probe.py").write_text(source, encoding="utf-8")
    assert violations("monitor.core", top) == [
        "monitor/core/rules/probe.py:3 imports monitor.shell.watch",
        "monitor/core/rules/probe.py:3 imports monitor.shell.watch.Watch",
        "monitor/core/rules/probe.py:5 imports monitor.kit",
        "monitor/core/rules/probe.py:5 imports monitor.kit.demo",
        "monitor/core/rules/probe.py:6 imports monitor.shell",
    ]


def test_no_test_module_imports_another_test_module() -> None:
    # Shared helpers live in tests/harness.py, tests/frames_factory.py and the fixtures.
    tests = PACKAGE.parent / "tests"
    found = [
        f"{path.relative_to(tests.parent)}:{line} imports {module}"
        for path in sorted(tests.rglob("*.py"))
        for line, module in imported_modules(path, tests)
        if module.startswith(("tests.test_", "tests.conftest"))
    ]
    assert found == []
