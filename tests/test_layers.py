"""The layers import downwards only: core imports neither shell nor kit, shell not kit
(nor either of them the stand-in server, `monitor.testing`); inside the core no module
imports itself back, through any chain of imports.

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


def imports(path: Path, top: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """Every import statement of `path` (under the package directory `top`): its line, the
    module named (relative imports resolved) and, for `from m import a, b`, the names."""
    package = ".".join(path.relative_to(top.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.append((node.lineno, base, tuple(alias.name for alias in node.names)))
    return found


def imported_modules(path: Path, top: Path) -> list[tuple[int, str]]:
    """Every module `path` imports or may import, by line: `from monitor import kit` imports
    monitor.kit."""
    found = set()
    for line, module, names in imports(path, top):
        found.add((line, module))
        found.update((line, f"{module}.{name}") for name in names)
    return sorted(found)


def violations(layer: str, top: Path = PACKAGE) -> list[str]:
    root = top.joinpath(*layer.split(".")[1:])
    banned = FORBIDDEN[layer]
    return [
        f"{path.relative_to(top.parent)}:{line} imports {module}"
        for path in sorted(root.rglob("*.py"))
        for line, module in imported_modules(path, top)
        if any(module == ban or module.startswith(ban + ".") for ban in banned)
    ]


def module_name(path: Path, top: Path) -> str:
    parts = path.relative_to(top.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(layer: str, top: Path = PACKAGE) -> dict[str, set[str]]:
    """Which modules of `layer` each module of it imports: `from a import b` imports the
    module a.b when there is one, else a; `import a.b` imports a.b."""
    paths = sorted(top.joinpath(*layer.split(".")[1:]).rglob("*.py"))
    modules = {module_name(path, top): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, module, names in imports(path, top):
            for target in [f"{module}.{n}" for n in names] or [module]:
                if target not in modules:
                    target = module
                if target in modules and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one, as the chain of imports (a, b, a)."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        # Depth first from `start`, back to `start`: the path is the chain of imports.
        stack = [(start, [start])]
        visited: set[str] = set()
        while stack:
            module, path = stack.pop()
            for target in sorted(graph[module]):
                if target == start:
                    if not seen.intersection(path):
                        found.append([*path, start])
                        seen.update(path)
                elif target not in visited:
                    visited.add(target)
                    stack.append((target, [*path, target]))
    return found


def test_the_core_has_no_import_cycle() -> None:
    assert cycles(import_graph("monitor.core")) == []


def test_the_cycle_check_sees_a_cycle_under_type_checking(tmp_path: Path) -> None:
    top = tmp_path / "monitor"
    (top / "core" / "rules").mkdir(parents=True)
    files = {
        "core/__init__.py": "",
        "core/rules/__init__.py": "from monitor.core.session import Record\n",
        "core/session.py": "from monitor.core import decisions\n",
        "core/decisions.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .rules import Rule\n"
        ),
        "core/frames.py": "import monitor.core.decisions\n",
    }
    for name, source in files.items():
        (top / name).write_text(source, encoding="utf-8")
    assert import_graph("monitor.core", top) == {
        "monitor.core": set(),
        "monitor.core.rules": {"monitor.core.session"},
        "monitor.core.session": {"monitor.core.decisions"},
        "monitor.core.decisions": {"monitor.core.rules"},
        "monitor.core.frames": {"monitor.core.decisions"},
    }
    assert cycles(import_graph("monitor.core", top)) == [
        [
            "monitor.core.decisions",
            "monitor.core.rules",
            "monitor.core.session",
            "monitor.core.decisions",
        ],
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


# The shell carries out the core's commands: it must never decide again. Every shell module
# is held to it but the adapters that turn what the core decided into the words, labels and
# URLs of their medium (they read an outcome or a route to say it, never to choose what to do):
ADAPTERS = {
    "api.py": "a route to its URL",
    "api_v2.py": "a route to its URL",
    "attach.py": "hands what it read of a session to the core, which names its engine",
    "diagnosis.py": "a failed connection to its hint",
    "evaluate.py": "a command's report of what the rules found",
    "metrics.py": "an outcome, a rule to a bounded label",
    "toast.py": "an outcome to the TUI's words",
    "webhook.py": "an outcome to a notification's words",
}
SHELL = sorted(path for path in (PACKAGE / "shell").glob("*.py") if path.name not in ADAPTERS)
DECIDING = {"Plan", "Rule", "Outcome", "plan", "rule", "outcome", "finding", "action", "route"}
# Nor does any shell module, the API client and `attach` included, work out which engine runs
# a session or which routes a server has: the decision's commands carry the route, and the
# core names the others (`Tracker.route`, `core/server.py`). The shell asks the core by
# calling its `route` (of the tracker or the monitor); a `route` worked out anywhere else, a
# server kind's fields read, or a look-up by engine, is a decision made again.
RESOLVING = {"new_engine", "engine_of", "engine", "adapter", "server_routes", "busy_reads"}
ASKED = "route"
CORE_FACES = {"tracker", "_tracker", "monitor", "_monitor"}
KIND_FIELDS = {"classic", "engine"}
ALL_SHELL = sorted((PACKAGE / "shell").glob("*.py"))


def decides(path: Path) -> list[str]:
    """Every test in `path` (a condition, a comparison, a match, a lookup) that names a plan,
    a rule or an outcome: the enums themselves, or a decision's fields that carry them.
    Passing an outcome on (to a callback, in a type) is no decision."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    annotations = {
        id(inner)
        for node in ast.walk(tree)
        for hint in (getattr(node, "annotation", None), getattr(node, "returns", None))
        if hint is not None
        for inner in ast.walk(hint)
    }
    tests: list[ast.AST] = []
    for node in ast.walk(tree):
        if id(node) in annotations:
            continue
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            tests.append(node.test)
        elif isinstance(node, ast.Compare | ast.Subscript):
            tests.append(node)
        elif isinstance(node, ast.Match):
            tests.append(node.subject)
    found = set()
    for test in tests:
        for node in ast.walk(test):
            if isinstance(node, ast.Name) and node.id in DECIDING:
                found.add((node.lineno, node.id))
            elif isinstance(node, ast.Attribute) and node.attr in DECIDING:
                found.add((node.lineno, "." + node.attr))
    return [f"{path.name}:{line} {name}" for line, name in sorted(found)]


@pytest.mark.parametrize("path", SHELL, ids=lambda path: path.name)
def test_no_shell_module_looks_at_a_plan_a_rule_or_an_outcome(path: Path) -> None:
    assert decides(path) == []


def test_the_loop_and_its_executors_are_held_to_it() -> None:
    held = {path.name for path in SHELL}
    assert {"actions.py", "executor.py", "follow.py", "watch.py", "resync.py"} <= held


def _receiver(call: ast.Call) -> str | None:
    """The name of what a method is called on (`tracker` in `self._tracker.route(s)`)."""
    value = getattr(call.func, "value", None)
    if isinstance(value, ast.Attribute):
        return value.attr
    return value.id if isinstance(value, ast.Name) else None


def resolves(path: Path) -> list[str]:
    """Every call in `path` of what works out a session's engine (`RESOLVING`, a `route` not
    asked of the core), and every read of a server kind's fields or of `engine_of`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name in RESOLVING or (name == ASKED and _receiver(node) not in CORE_FACES):
                found.append((node.lineno, str(name)))
        elif isinstance(node, ast.Attribute) and node.attr in KIND_FIELDS:
            if id(node) not in called:
                found.append((node.lineno, "." + node.attr))
        else:
            named = {
                ast.Name: "id",
                ast.keyword: "arg",
                ast.FunctionDef: "name",
                ast.AsyncFunctionDef: "name",
            }.get(type(node))
            name = None if named is None else getattr(node, named)
            if name in {"new_engine", "engine_of"}:
                found.append((getattr(node, "lineno", 0), str(name)))
    return [f"{path.name}:{line} {name}" for line, name in sorted(set(found))]


@pytest.mark.parametrize("path", ALL_SHELL, ids=lambda path: path.name)
def test_no_shell_module_works_out_an_engine(path: Path) -> None:
    assert resolves(path) == []


@pytest.mark.parametrize("path", ALL_SHELL, ids=lambda path: path.name)
def test_no_shell_module_speaks_of_the_classic_or_the_new_engine_by_name(path: Path) -> None:
    # The routes are numbers the core gives; the words went with the look-ups.
    text = path.read_text(encoding="utf-8").lower()
    assert [word for word in ("new_engine", "classic") if word in text] == []


# The shell reaches the core through `Monitor` alone: frames, read-backs and queries go to it,
# never to the tracker it wraps. The one module that names the tracker, and why:
TRACKER_NAMED = {"watch.py": "makes the tracker it hands `Monitor` (the core's wiring)"}
TRACKER_NAMES = {"Tracker", "tracker", "_tracker"}


def reaches_tracker(path: Path) -> list[str]:
    """Every name of the tracker in `path`: the class, and a variable or attribute of it (an
    attribute in every module: `watch.py` makes it, and reads nothing of it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TRACKER_NAMES:
            found.add((node.lineno, "." + node.attr))
        elif path.name in TRACKER_NAMED:
            continue
        elif isinstance(node, ast.Name) and node.id in TRACKER_NAMES:
            found.add((node.lineno, node.id))
        elif isinstance(node, ast.ImportFrom) and "Tracker" in {a.name for a in node.names}:
            found.add((node.lineno, "Tracker"))
    return [f"{path.name}:{line} {name}" for line, name in sorted(found)]


@pytest.mark.parametrize("path", ALL_SHELL, ids=lambda path: path.name)
def test_no_shell_module_reaches_the_tracker_but_through_monitor(path: Path) -> None:
    assert reaches_tracker(path) == []


@pytest.mark.parametrize(
    ("name", "source", "found"),
    [
        ("x.py", "def f(self, d):\n    return self._tracker.feed_data(d)\n", ["x.py:2 ._tracker"]),
        ("x.py", "def f(m):\n    return m.tracker.known()\n", ["x.py:2 .tracker"]),
        ("x.py", "from monitor.core.tracker import Tracker\n", ["x.py:1 Tracker"]),
        ("x.py", "def f(tracker):\n    return tracker.held()\n", ["x.py:2 tracker"]),
        ("watch.py", "def f(d):\n    tracker = Tracker(d)\n    return Monitor(tracker)\n", []),
        ("watch.py", "def f(self):\n    return self.tracker.held()\n", ["watch.py:2 .tracker"]),
    ],
)
def test_the_tracker_check_sees_the_tracker_reached(
    tmp_path: Path, name: str, source: str, found: list[str]
) -> None:
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    assert reaches_tracker(path) == found


def test_the_engine_check_covers_the_api_client_and_attach() -> None:
    assert {"api.py", "api_v2.py", "attach.py"} <= {path.name for path in ALL_SHELL}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("async def act(api, c):\n    api.new_engine(c.session_id)\n", ["x.py:2 new_engine"]),
        ("def f(api):\n    if api.server.classic:\n        pass\n", ["x.py:2 .classic"]),
        ("def f(kind):\n    return kind.engine\n", ["x.py:2 .engine"]),
        ("async def f(api, s):\n    return await api.engine(s, None)\n", ["x.py:2 engine"]),
        ("def f(api):\n    return api.busy_reads()\n", ["x.py:2 busy_reads"]),
        ("def f(t, s):\n    return t.adapter.engine(s)\n", ["x.py:2 engine"]),
        ("def f(api, s):\n    return api.route(s)\n", ["x.py:2 route"]),
        ("def f(http):\n    return API(http, engine_of=len)\n", ["x.py:2 engine_of"]),
        ("def new_engine(s):\n    return 2\n", ["x.py:1 new_engine"]),
        # Asked of the core: no look-up.
        ("def f(self, s):\n    return self._tracker.route(s)\n", []),
        ("def f(monitor, s):\n    return monitor.route(s)\n", []),
    ],
)
def test_the_engine_check_sees_a_look_up(tmp_path: Path, source: str, found: list[str]) -> None:
    path = tmp_path / "x.py"
    path.write_text(source, encoding="utf-8")
    assert resolves(path) == found


def test_the_executor_check_sees_a_branch_on_a_plan(tmp_path: Path) -> None:
    source = tmp_path / "actions.py"
    source.write_text(
        "def act(decision):\n    if decision.plan == Plan.STOP:\n        return 1\n",
        encoding="utf-8",
    )
    assert decides(source) == ["actions.py:2 .plan", "actions.py:2 Plan"]


# Each module's face: `__all__` names what other modules (and users) take from it, so the next
# reader knows what is supported; a name no other module takes is the module's own.
def faces(top: Path = PACKAGE) -> dict[str, list[str] | None]:
    """Each module's `__all__` as its source writes it (None: it has none). `__main__` is run,
    never imported, and a private `_x.py` is all its package's own."""
    found: dict[str, list[str] | None] = {}
    for path in sorted(top.rglob("*.py")):
        if path.name == "__main__.py" or (path.name.startswith("_") and path.stem != "__init__"):
            continue
        found[module_name(path, top)] = next(
            (
                [ast.literal_eval(item) for item in node.value.elts]
                for node in ast.parse(path.read_text(encoding="utf-8")).body
                if isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.List)
                and any(
                    isinstance(target, ast.Name) and target.id == "__all__"
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                )
            ),
            None,
        )
    return found


def taken(path: Path, top: Path, modules: set[str]) -> set[tuple[str, str]]:
    """(module, name) for every name `path` takes from another module of the package:
    `from m import name`, and `alias.name` where `import m as alias` or `from p import m`."""
    aliases: dict[str, str] = {}
    found = set()
    for _, module, names in imports(path, top):
        for name in names:
            if f"{module}.{name}" in modules:
                aliases[name] = f"{module}.{name}"
            elif module in modules:
                found.add((module, name))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.add((aliases[node.value.id], node.attr))
    return {(module, name) for module, name in found if module != module_name(path, top)}


def faceless(top: Path = PACKAGE) -> list[str]:
    """Modules without `__all__`, and names one module takes from another that are not in
    the other's `__all__`."""
    face = faces(top)
    modules = {module_name(path, top) for path in top.rglob("*.py")}
    missing = [f"{module} has no __all__" for module, names in face.items() if names is None]
    for path in sorted(top.rglob("*.py")):
        for module, name in sorted(taken(path, top, modules)):
            if name not in (face.get(module) or ()) and module in face:
                where = path.relative_to(top.parent)
                missing.append(f"{where} takes {name} from {module}, not in its __all__")
    return missing


def test_every_module_names_its_face_and_every_name_taken_is_in_it() -> None:
    assert faceless() == []


def test_the_face_check_sees_a_module_without_all_and_a_name_left_out(tmp_path: Path) -> None:
    top = tmp_path / "monitor"
    (top / "core").mkdir(parents=True)
    files = {
        "__init__.py": "__all__: list[str] = []\n",
        "__main__.py": "from monitor.core.a import run\n",
        "core/__init__.py": "",
        "core/_private.py": "X = 1\n",
        "core/a.py": '__all__ = ["run"]\ndef run(): ...\ndef helper(): ...\nLIMIT = 1\n',
        "core/b.py": (
            "__all__ = []\nfrom monitor.core.a import run, helper\nfrom . import a\n"
            "import monitor.core.a as same\nprint(a.LIMIT, same.run)\n"
        ),
    }
    for name, source in files.items():
        (top / name).write_text(source, encoding="utf-8")
    assert faceless(top) == [
        "monitor.core has no __all__",
        "monitor/core/b.py takes LIMIT from monitor.core.a, not in its __all__",
        "monitor/core/b.py takes helper from monitor.core.a, not in its __all__",
    ]


def hash_calls(layer: str, top: Path = PACKAGE) -> list[str]:
    """Every call of the builtin `hash()` in `layer`: salted per process for a str or bytes
    (PYTHONHASHSEED), an address for None on 3.11, so no decision may rest on it."""
    root = top.joinpath(*layer.split(".")[1:])
    return [
        f"{path.relative_to(top.parent)}:{node.lineno}"
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash"
    ]


def test_the_core_never_calls_the_builtin_hash() -> None:
    """Issue 44: the same recording, the same verdicts in every process; the core's digests
    are `signature.text_crc`, `signature_digest` and `int_digest`."""
    assert hash_calls("monitor.core") == []


def test_the_hash_check_sees_a_call(tmp_path: Path) -> None:
    top = tmp_path / "monitor"
    (top / "core" / "rules").mkdir(parents=True)
    source = "def f(x):\n    key = x.__hash__()\n    return hash((x, None)) & 1\n"
    (top / "core" / "rules" / "probe.py").write_text(source, encoding="utf-8")
    assert hash_calls("monitor.core", top) == ["monitor/core/rules/probe.py:3"]
