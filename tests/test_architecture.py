"""docs/architecture.md agrees with the code (issue 43: 6 of 12 claims checked in the old one
were false). Read from the document, checked against the source:

- every path it names exists;
- every `Class.member` and `module.name` it writes is there, every `Name` it writes is defined
  in the package, and the names it gives a module (`**`path`** (`Name`)`, `(`Name`,
  **`path`**)`, `` `Name` (**`path`**) ``) are defined in that module;
- `Monitor`'s inputs are exactly its public methods with their parameters, and the commands
  exactly `core/commands.py`'s `Command` union with their fields, as are the intervention's
  own commands and results;
- each table's states, events and pairs are counted right and its states and events named;
- every `CONSTANT` (N) has that value, every line count it states holds.
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import pkgutil
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "monitor"
DOC = ROOT / "docs" / "architecture.md"
PLUGIN = PACKAGE / "plugin" / "loop-guard.ts"

# What the document names from outside the package.
EXTERNAL = {"TYPE_CHECKING", "json.loads", "structlog.testing"}

PATH = re.compile(
    r"(?<![\w/.-])((?:monitor/)?(?:core|shell|kit|plugin|rules)/[\w/.-]+\.(?:py|ts)"
    r"|monitor/\w+\.py|(?:tests|docs|bench)/[\w/.-]+\.(?:py|md)|(?<=`)\w+\.py(?=`))"
)
DOTTED = re.compile(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(.*\))?")
CAPITAL = re.compile(r"([A-Z]\w*)(?:\(.*\))?")
SIGNATURE = re.compile(r"^\| `(\w+)\(([^)]*)\)` \|", re.M)


def text() -> str:
    return DOC.read_text(encoding="utf-8")


def prose(source: str) -> str:
    """The document without its fenced blocks (a drawing names no code)."""
    return re.sub(r"^```.*?^```", "", source, flags=re.M | re.S)


def backticked(source: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(source))


def resolve(path: str) -> Path:
    if path.startswith(("monitor/", "tests/", "docs/", "bench/")):
        return ROOT / path
    if path.startswith("rules/"):
        return PACKAGE / "core" / path
    return PACKAGE / path


def section(source: str, heading: str) -> str:
    """From `heading` to the next heading of any level."""
    start = source.index(f"\n{heading}\n")
    end = re.compile(r"^#", re.M).search(source, start + len(heading) + 2)
    return source[start : end.start() if end else len(source)]


@functools.cache
def trees() -> dict[Path, ast.Module]:
    return {
        path: ast.parse(path.read_text(encoding="utf-8"), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, ast.AnnAssign):
        return [node.target]
    return []


def defined(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body defines (imports are not definitions)."""
    names = set()
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        names.update(t.id for t in targets(node) if isinstance(t, ast.Name))
    return names


def top_names(path: Path) -> set[str]:
    return defined(trees()[path].body)


def own_members(cls: ast.ClassDef) -> set[str]:
    """A class's methods, class attributes, fields, slots, and what its methods set on self."""
    members = defined(cls.body)
    for node in ast.walk(cls):
        for target in targets(node):
            if isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "self":
                members.add(target.attr)
            if getattr(target, "id", "") == "__slots__" and isinstance(node, ast.Assign):
                members.update(ast.literal_eval(node.value))
    return members


@functools.cache
def classes() -> dict[str, list[set[str]]]:
    """Each class name of the package: the members of each class so named, its bases' too."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for tree in trees().values():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [getattr(base, "id", "") for base in node.bases]
                found.setdefault(node.name, []).append((own_members(node), bases))

    def members(name: str) -> list[set[str]]:
        result = []
        for own, bases in found.get(name, []):
            inherited = [m for base in bases if base in found for m in members(base)]
            result.append(own.union(*inherited))
        return result

    return {name: members(name) for name in found}


@functools.cache
def modules_by_stem() -> dict[str, list[Path]]:
    stems: dict[str, list[Path]] = {}
    for path in trees():
        stem = path.parent.name if path.stem == "__init__" else path.stem
        stems.setdefault(stem, []).append(path)
    return stems


def plugin_names() -> set[str]:
    source = PLUGIN.read_text(encoding="utf-8")
    return set(re.findall(r"\b(?:class|const|function|interface|type)\s+(\w+)", source))


def events_named_elsewhere() -> set[str]:
    """Log events (docs/logs.md, checked against the code by tests/test_docs.py) and the
    server's event types."""
    from monitor.core.events import KNOWN_EVENT_TYPES

    logs = (ROOT / "docs" / "logs.md").read_text(encoding="utf-8")
    return set(re.findall(r"^### `([a-z_.]+)`", logs, re.M)) | set(KNOWN_EVENT_TYPES)


def dotted_problems(source: str) -> list[str]:
    events = events_named_elsewhere()
    problems = []
    for token in backticked(source):
        match = DOTTED.fullmatch(token)
        if match is None:
            continue
        owner, name = match.groups()
        if f"{owner}.{name}" in events | EXTERNAL or name in ("py", "md", "ts"):
            continue  # an event, or a path (test_every_path_named_exists)
        if owner == "monitor":
            if not (PACKAGE / name).is_dir() and not (PACKAGE / f"{name}.py").exists():
                problems.append(f"{token}: no such module")
            continue
        if owner in classes():
            if not any(name in members for members in classes()[owner]):
                problems.append(f"{token}: {owner} has no {name}")
        elif owner in modules_by_stem():
            if not any(name in top_names(path) for path in modules_by_stem()[owner]):
                problems.append(f"{token}: no module {owner} defines {name}")
        else:
            problems.append(f"{token}: {owner} is no class, module or event")
    return problems


def capital_problems(source: str) -> list[str]:
    everywhere = set().union(*(top_names(path) for path in trees())) | plugin_names() | EXTERNAL
    return [
        f"{token}: not defined"
        for token in backticked(source)
        if (match := CAPITAL.fullmatch(token)) and match.group(1) not in everywhere
    ]


def attributions(source: str) -> list[tuple[str, str]]:
    """(path, name) for each name the document gives a module: `**`path`** (`A`, `B`: ...)`
    (the names before a colon), `(`A`, **`path`**`, and `` `A` (**`path`**) ``."""
    source = " ".join(prose(source).split())
    found = []
    bold = r"\*\*`([\w/.]+\.py)`\*\*"
    for match in re.finditer(bold + r" \(", source):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        group = source[match.end() : end - 1].split(":")[0]
        found += [(match.group(1), name) for name in re.findall(r"`(\w+)`", group)]
    for match in re.finditer(r"\(([^()]*?)" + bold, source):
        found += [(match.group(2), name) for name in re.findall(r"`(\w+)`", match.group(1))]
    for match in re.finditer(r"`([\w.]+)` \(" + bold, source):
        found.append((match.group(2), match.group(1)))
    return found


def attribution_problems(source: str) -> list[str]:
    problems = []
    for path, token in attributions(source):
        module = resolve(path)
        owner, _, rest = token.partition(".")
        name = rest if rest and owner == module.stem else owner
        if module not in trees() or name not in top_names(module):
            problems.append(f"{token} is not defined in {path}")
    return problems


def test_every_path_named_exists() -> None:
    named = set(PATH.findall(text()))
    assert {"core/monitor.py", "shell/follow.py", "core/commands.py"} <= named
    assert sorted(path for path in named if not resolve(path).exists()) == []


def test_every_dotted_name_is_a_member_of_its_class_or_module() -> None:
    assert dotted_problems(text()) == []


def test_every_capitalised_name_is_defined() -> None:
    assert capital_problems(text()) == []


def test_every_name_given_a_module_is_defined_there() -> None:
    found = attributions(text())
    assert ("shell/follow.py", "Follow") in found
    assert ("core/monitor.py", "Monitor") in found
    assert attribution_problems(text()) == []


def test_the_checks_see_a_name_moved_or_misspelt() -> None:
    # The old document's own mistake: `rules_of` said to be the tracker's.
    assert attribution_problems("(`rules_of`, **`core/tracker.py`**)") == [
        "rules_of is not defined in core/tracker.py"
    ]
    assert dotted_problems("`Monitor.feed` `plan.decidee` `Tracker.judge`") == [
        "Monitor.feed: Monitor has no feed",
        "plan.decidee: no module plan defines decidee",
    ]
    assert capital_problems("`Watcher` `Follow`") == ["Watcher: not defined"]


def signatures(source: str, heading: str) -> dict[str, list[str]]:
    rows = SIGNATURE.findall(section(source, heading))
    return {name: [p.strip() for p in params.split(",") if p.strip()] for name, params in rows}


def monitor_class() -> ast.ClassDef:
    tree = trees()[PACKAGE / "core" / "monitor.py"]
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Monitor")


def test_the_inputs_are_monitors_public_methods() -> None:
    methods = {
        node.name: [arg.arg for arg in node.args.args[1:] + node.args.kwonlyargs]
        for node in monitor_class().body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }
    assert signatures(text(), "### Inputs") == methods


def union(path: Path, name: str) -> list[str]:
    """The classes of the union `name = A | B | ...` in `path`, in order."""
    node = next(
        n.value
        for n in trees()[path].body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == name
    )
    return flatten(node)


def flatten(node: ast.expr) -> list[str]:
    if isinstance(node, ast.BinOp):
        return flatten(node.left) + flatten(node.right)
    assert isinstance(node, ast.Name)
    return [node.id]


def fields(path: Path, name: str) -> list[str]:
    cls = next(n for n in trees()[path].body if isinstance(n, ast.ClassDef) and n.name == name)
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def test_the_commands_are_the_command_union_with_their_fields() -> None:
    path = PACKAGE / "core" / "commands.py"
    expected = {name: fields(path, name) for name in union(path, "Command")}
    assert signatures(text(), "### Commands") == expected


def test_the_interventions_commands_and_results_are_its_unions() -> None:
    path = PACKAGE / "core" / "intervention.py"
    source = " ".join(prose(text()).split())
    commands = re.search(r"\(\*\*`core/intervention\.py`\*\*: ([^)]*)\)", source)
    results = re.search(r"what came of each \(([^)]*)\)", source)
    assert commands is not None and results is not None
    assert re.findall(r"`(\w+)`", commands.group(1)) == union(path, "Command")
    assert re.findall(r"`(\w+)`", results.group(1)) == union(path, "Happened")


TABLE_ROW = re.compile(r"^\| [^|]+ \| `(\w+)\.(\w+)` \| (\d+) \| (\d+) \| (\d+) of (\d+) \|$", re.M)


def paragraph(source: str, path: str) -> str:
    start = source.index(f"\n**`{path}`**:")
    return source[start : source.index("\n\n", start)]


@functools.cache
def enum_values() -> set[str]:
    import monitor.core

    values: set[str] = set()
    for info in pkgutil.walk_packages(monitor.core.__path__, "monitor.core."):
        for value in vars(importlib.import_module(info.name)).values():
            if isinstance(value, type) and issubclass(value, enum.StrEnum):
                values.update(member.value for member in value)
    return values


def test_each_table_is_counted_and_its_states_and_events_named() -> None:
    source = text()
    rows = TABLE_ROW.findall(source)
    assert [row[0] for row in rows] == ["calls", "runs", "handover", "intervention"]
    for module_name, table_name, states, events, pairs, of in rows:
        table = getattr(importlib.import_module(f"monitor.core.{module_name}"), table_name)
        state, event = (type(part) for part in next(iter(table)))
        assert all(isinstance(s, state) and isinstance(e, event) for s, e in table)
        counted = (len(state), len(event), len(table), len(state) * len(event))
        assert tuple(map(int, (states, events, pairs, of))) == counted, module_name
        words = set(re.findall(r"`(\w+)`", paragraph(source, f"core/{module_name}.py")))
        assert {m.value for m in (*state, *event)} - words == set(), module_name
        module = PACKAGE / "core" / f"{module_name}.py"
        assert {w for w in words if w.islower()} - enum_values() - top_names(module) == set()


CONSTANT = re.compile(r"`(?:(\w+)\.)?([A-Z][A-Z0-9_]+)` \((\d[\d,]*(?:\.\d+)?)(?: s)?\)")


def constant_problems(source: str) -> list[str]:
    problems = []
    for stem, name, stated in CONSTANT.findall(prose(source)):
        paths = [p for p in trees() if name in top_names(p) and stem in ("", p.stem)]
        if len(paths) == 1:
            parts = paths[0].relative_to(ROOT).with_suffix("").parts
            value = getattr(importlib.import_module(".".join(parts)), name)
        elif not paths and (ts := re.search(rf"const {name} = (\d+)\n", PLUGIN.read_text())):
            value = int(ts.group(1))
        else:
            problems.append(f"{name}: defined in {len(paths)} modules")
            continue
        if float(stated.replace(",", "")) != value:
            problems.append(f"{name} is {value}, not {stated}")
    return problems


def test_every_constant_stated_has_its_value() -> None:
    assert len(CONSTANT.findall(text())) >= 5
    assert constant_problems(text()) == []
    assert constant_problems("`RESYNC_CONCURRENCY` (8)") == ["RESYNC_CONCURRENCY is 16, not 8"]


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_every_line_count_stated_holds() -> None:
    source = " ".join(prose(text()).split())
    under = re.findall(r"`([\w/]+\.py)` is under (\d+) lines", source)
    over = re.findall(r"no (\w+) module is over (\d+) lines", source)
    assert under and over
    for path, limit in under:
        assert lines(resolve(path)) < int(limit), path
    for layer, limit in over:
        assert max(lines(path) for path in (PACKAGE / layer).rglob("*.py")) <= int(limit)
