"""Write the corpus traces made by hand, from how agents behave: `python -m tests.corpus.written`.

Each is one session as the server streams it (`/event` form, pending, running, then completed
or error per call; bash with `metadata.exit`), after its label line (monitor/core/evaluate.py).
The real-server recordings beside them come from `tests.corpus.record`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
Call = tuple[str, dict[str, Any], str, Any]  # tool, input, status, output/error (+ exit)


def ok(tool: str, args: dict[str, Any], output: str = "") -> Call:
    return (tool, args, "completed", (output, 0))


def fails(command: str, output: str, code: int = 1) -> Call:
    return ("bash", {"command": command}, "completed", (output, code))


def error(tool: str, args: dict[str, Any], message: str) -> Call:
    return (tool, args, "error", message)


def sh(command: str, output: str = "", description: str | None = None) -> Call:
    args = (
        {"command": command}
        if description is None
        else {"command": command, "description": description}
    )
    return ok("bash", args, output)


def read(path: str) -> Call:
    return ok("read", {"filePath": path}, f"<file>{path}</file>")


def edit(path: str, old: str, new: str) -> Call:
    return ok("edit", {"filePath": path, "oldString": old, "newString": new}, "Edit applied.")


def streams(command: str, lines: list[str], per_update: int, code: int = 0) -> Call:
    """A bash call streaming `lines`, `per_update` more at each re-sent `running` update."""
    outputs = [
        "".join(line + "\n" for line in lines[:end])
        for end in range(per_update, len(lines) + 1, per_update)
    ]
    return ("bash", {"command": command}, "streams", (outputs, (outputs[-1], code)))


def todo(n: int) -> Call:
    return ok("todowrite", {"todos": [{"content": f"step {n}", "status": "in_progress"}]}, "[]")


def frames(session: str, calls: list[Call]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "session.status", "properties": {"sessionID": session, "status": {"type": "busy"}}}
    ]
    for n, (tool, args, status, result) in enumerate(calls, 1):
        part = f"prt_{session}_{n:03d}"
        states: list[dict[str, Any]] = [
            {"status": "pending", "input": {}},
            {"status": "running", "input": args},
        ]
        if status == "streams":  # bash re-sends `running` with its output so far, then ends
            streamed, result = result
            states += [
                {"status": "running", "input": args, "metadata": {"output": text}}
                for text in streamed
            ]
        if status == "error":
            states.append({"status": "error", "input": args, "error": result})
        else:
            output, code = result
            final = {"status": "completed", "input": args, "output": output}
            if tool == "bash":
                final["metadata"] = {"output": output, "exit": code}
            states.append(final)
        for state in states:
            out.append(
                {
                    "type": "message.part.updated",
                    "properties": {
                        "sessionID": session,
                        "part": {
                            "id": part,
                            "type": "tool",
                            "tool": tool,
                            "callID": f"call_{n}",
                            "sessionID": session,
                            "messageID": f"msg_{n}",
                            "state": state,
                        },
                    },
                }
            )
    out.append({"type": "session.idle", "properties": {"sessionID": session}})
    return out


PYTEST_FAIL = "FAILED tests/test_calc.py::test_add - assert {} == 5\n1 failed in 0.{}s"
TRACEBACK = (
    "Traceback (most recent call last):\n  File \"/tmp/tmp{}/run.py\", line {}\nKeyError: 'user'"
)

TRACES: dict[str, tuple[str, list[Call]]] = {
    # --- same failure ----------------------------------------------------------------------
    "w-failure-same-error-prose-commands": (
        "loop at 4",
        [
            fails("npm run build", "sh: 1: vite: not found", 127),
            fails("npx vite build", "sh: 1: vite: not found", 127),
            fails("cd web && npm run build", "sh: 1: vite: not found", 127),
            fails("Build the web app with vite", "sh: 1: vite: not found", 127),
            fails("npm run build --silent", "sh: 1: vite: not found", 127),
        ],
    ),
    "w-failure-line-numbers-change": (
        "loop at 4",
        [fails(f"python run.py --try {n}", TRACEBACK.format(8000 + n, 40 + n)) for n in range(6)],
    ),
    "w-failure-tool-error-state": (
        "loop at 4",
        [
            error(
                "read", {"filePath": f"src/{name}"}, "File not found: /home/dev/project/src/app.ts"
            )
            for name in ("app.ts", "./app.ts", "app.ts ", "src/../app.ts", "app.ts")
        ],
    ),
    "w-failure-edit-old-string-not-found": (
        "loop at 4",
        [
            error(
                "edit",
                {"filePath": "a.py", "oldString": f"x = {n}", "newString": "x = 0"},
                "oldString not found in content",
            )
            for n in range(5)
        ],
    ),
    "w-legit-three-failures-then-fix": (
        "legit",
        [
            fails("python3 -c 'import yaml'", "ModuleNotFoundError: No module named 'yaml'"),
            fails("python3 tool.py", "ModuleNotFoundError: No module named 'yaml'"),
            fails("python3 -m tool", "ModuleNotFoundError: No module named 'yaml'"),
            sh("pip install pyyaml", "Successfully installed PyYAML-6.0.1"),
            sh("python3 tool.py", "done"),
        ],
    ),
    "w-legit-different-failures": (
        "legit",
        [
            fails(
                f"make target{n}",
                f"make: *** No rule to make target 'target{chr(97 + n)}'.  Stop.",
                2,
            )
            for n in range(6)
        ],
    ),
    # Five edits, and the test fails the same way after each (the durations aside): no
    # edit reaches what the test runs; rule `no_progress` at the 5th run.
    "w-no-progress-failures-between-edits": (
        "loop at 10",
        [
            c
            for n in range(5)
            for c in (
                edit("calc.py", f"v{n}", f"v{n + 1}"),
                fails("pytest -q", PYTEST_FAIL.format(4, 10 + n)),
            )
        ],
    ),
    # One TODO after another, each edit in a new place, while an unrelated lint check keeps
    # printing the same two warnings: progress, not a loop (`no_progress` fired here before it
    # told a step somewhere new from a rewrite of the run's own change).
    "w-legit-distinct-edits-same-check": (
        "legit",
        [
            c
            for n in range(8)
            for c in (
                edit(f"src/m{n % 3}.py", f"# TODO {n}: validate", f"check_{n}(value)"),
                sh("npm run lint", "2 warnings (unused import in legacy/old.py)"),
            )
        ],
    ),
    # The agent rewrites its own unverified change again and again (each edit's old text is
    # what the previous one added) and the test fails the same way each time.
    "w-no-progress-rewrites-own-change": (
        "loop at 10",
        [
            c
            for n in range(6)
            for c in (
                edit(
                    "src/parse.py",
                    "    return int(text)" if n == 0 else f"    return parse_v{n}(text)",
                    f"    return parse_v{n + 1}(text)",
                ),
                fails("pytest -q tests/test_parse.py", PYTEST_FAIL.format(3, 20 + n)),
            )
        ],
    ),
    # Working through a list in one file: a different line of one module each time, never a
    # line an earlier edit touched or added, while a script prints the same error after each
    # (issue 44: this was "w-no-progress-same-file-other-lines", a loop at 11 by issue 31's
    # same-file rule; the real loops of this shape come back to lines they wrote).
    "w-legit-list-in-one-file": (
        "legit",
        [fails("python3 repro.py", "ValueError: total 41 != 42")]
        + [
            c
            for n in range(8)
            for c in (
                edit("src/calc.py", f"    a{n} = round(a{n})", f"    a{n} = int(a{n})"),
                fails("python3 repro.py", "ValueError: total 41 != 42"),
            )
        ],
    ),
    # The real loops of that shape (issue 44): two lines of one module written, then
    # rewritten in turn, the script printing the same error after each; `no_progress` at
    # its 5th rerun.
    "w-no-progress-lines-rewritten-in-turn": (
        "loop at 12",
        [
            edit("src/calc.py", "    a = round(a)", "    a = int(a)"),
            edit("src/calc.py", "    b = round(b)", "    b = int(b)"),
        ]
        + [
            c
            for n in range(8)
            for c in (
                edit(
                    "src/calc.py",
                    f"    {'ab'[n % 2]} = {('int', 'floor', 'ceil', 'trunc')[n // 2]}"
                    f"({'ab'[n % 2]})",
                    f"    {'ab'[n % 2]} = {('floor', 'ceil', 'trunc', 'abs')[n // 2]}"
                    f"({'ab'[n % 2]})",
                ),
                fails("python3 repro.py", "ValueError: total 41 != 42"),
            )
        ],
    ),
    # Issue 31: edit, run the test under the debugger (it stops at the same prompt), `quit`
    # (answered the same): the debugger's run is the check; `no_progress` at its 5th run.
    # Each edit rewrites the line the one before wrote (issue 44).
    "w-no-progress-debugger-quit": (
        "loop at 14",
        [
            c
            for n in range(8)
            for c in (
                edit("src/calc.py", f"    b = {n}", f"    b = {n + 1}"),
                sh("python -m pytest --pdb tests/test_calc.py", "> tests/test_calc.py(9)\n(Pdb)"),
                sh("quit", "Exit: Quitting debugger"),
            )
        ],
    ),
    # Different launches, each interrupted with a keystroke (`C-c`, answered `^C`), with
    # changes between: the interrupt checks nothing, so it is no repeated check.
    "w-legit-interrupt-after-launches": (
        "legit",
        [
            c
            for n in range(7)
            for c in (
                sh(f"sed -i 's/PORT = .*/PORT = {8000 + n}/' settings.py"),
                sh(f"python serve.py --workers {n + 1}", f"serving with {n + 1} workers"),
                sh("C-c", "^C"),
            )
        ],
    ),
    "w-legit-silent-successes": (
        "legit",
        [sh(f"mkdir -p build/{d}") for d in "abcdefgh"] + [sh("true")] * 3,
    ),
    # --- label and volatile arguments --------------------------------------------------------
    "w-relabelled-task": (
        "loop at 4",
        [
            ok(
                "task",
                {
                    "description": f"Find config ({n})",
                    "prompt": "Find where the port is set",
                    "subagent_type": "explore",
                },
                "not found",
            )
            for n in range(5)
        ],
    ),
    "w-timeout-raised-each-retry": (
        "loop at 4",
        [
            ok("bash", {"command": "make test", "timeout": 60000 * n}, "Terminated")
            for n in range(1, 6)
        ],
    ),
    "w-legit-same-description-different-commands": (
        "legit",
        [sh(f"grep -n TODO src/{f}", f"{f}:1: TODO", "Search TODOs") for f in "abcdefgh"],
    ),
    # --- bookkeeping between retries ---------------------------------------------------------
    "w-todo-between-identical-reads": (
        "loop at 4",
        [c for n in range(6) for c in (todo(n), read("config.yaml"))],
    ),
    "w-legit-todo-between-different-reads": (
        "legit",
        [c for n in range(8) for c in (todo(n), read(f"src/mod{n}.py"))],
    ),
    # --- long cycles -------------------------------------------------------------------------
    "w-cycle-of-6": (
        "loop at 18",
        [
            c
            for _ in range(4)
            for c in (
                sh("make build"),
                sh("make test"),
                read("build.log"),
                read("src/main.c"),
                sh("git diff"),
                sh("git status"),
            )
        ],
    ),
    # `cycle` would take it at its 3rd repetition (24); `revisit` takes it at its 12th
    # revisit, 4 calls into the 2nd repetition.
    "w-cycle-of-8": (
        "loop at 20",
        [c for _ in range(3) for c in [read(f"f{k}.c") for k in range(7)] + [sh("make")]],
    ),
    "w-legit-routine-of-6-over-modules": (
        "legit",
        [
            c
            for m in range(5)
            for c in (
                read(f"m{m}.py"),
                edit(f"m{m}.py", "a", "b"),
                sh(f"ruff check m{m}.py"),
                sh(f"pytest tests/test_m{m}.py"),
                sh("git diff --stat"),
                sh(f"git add m{m}.py"),
            )
        ],
    ),
    "w-pair-cycle": (
        "loop at 6",
        [c for _ in range(4) for c in (read("a.py"), sh("python3 a.py", "3"))],
    ),
    "w-identical-read": ("loop at 4", [read("README.md")] * 6),
    "w-legit-many-reads": ("legit", [read(f"docs/page{n}.md") for n in range(30)]),
    "w-legit-batch-edits": (
        "legit",
        [edit(f"pkg/m{n}.py", "import os", "import os\nimport sys") for n in range(12)],
    ),
    # --- searching in circles (rule `circles`) -----------------------------------------------
    # Ten different searches whose filter drops every hit: `find` succeeds silently, `grep`
    # fails silently, in turn (never four identical failures in a row, so `failure` misses it).
    "w-circles-empty-finds": (
        "loop at 11",
        [sh("ls src", "api\nweb\nworker")]
        + [
            sh(f"find src -name '*{t}*' | grep -i handler")
            if n % 2
            else fails(f"grep -rn 'class {t}Handler' src", "", 1)
            for n, t in enumerate(("Auth", "Login", "Session", "Token", "User", "Jwt", "Oauth"))
        ]
        + [sh("find . -path ./node_modules -prune -o -name '*handler*' -print | grep -v test")]
        + [fails("grep -rln 'HandlerFactory' --include=*.py .", "", 1)] * 1
        + [sh("find src -type f -newer setup.py | grep handler")],
    ),
    # Issue 31: different `find` / `grep` searches, each ending in the same filter, which
    # drops every hit (the files it wants are all under tests/): each prints nothing; the
    # agent recovered only at the 11th. `circles` at the 6th search through the filter.
    "w-circles-same-filter": (
        "loop at 7",
        [sh("ls", "src\ntests\nsetup.py")]
        + [
            sh(f"{search} | grep -v tests")
            for search in (
                "find . -name '*fixture*'",
                "grep -rln 'def make_client' .",
                "find . -name 'conftest.py'",
                "grep -rln 'pytest.fixture' .",
                "find . -path '*fixtures*'",
                "grep -rn 'client =' . --include=*.py",
                "find . -name '*client*'",
                "grep -rln 'TestClient' .",
                "find . -name '*factory*'",
            )
        ],
    ),
    # Searches for a symbol that does not exist: the same trio (a grep that finds nothing, a
    # glob and a read that bring back what they brought before) again and again, other empty
    # searches between.
    "w-circles-missing-symbol": (
        "loop at 12",
        [
            c
            for n in range(6)
            for c in (
                ok("grep", {"pattern": "parseConfig", "path": "src"}, "No files found"),
                ok("glob", {"pattern": "src/**/config*"}, "src/config.ts\nsrc/config.test.ts"),
                read("src/config.ts"),
                ok("grep", {"pattern": f"parseConfig{n}|parse_config{n}"}, "No files found"),
                sh(f"rg -l 'ConfigParser{n}' src"),
            )
        ][:26],
    ),
    # Looking for the right file: six misses in a row, then hits, reads and the edit.
    "w-legit-six-misses-then-found": (
        "legit",
        [sh(f"grep -rn 'def {name}' src") for name in ("load", "read", "parse", "open")]
        + [ok("glob", {"pattern": f"**/*{n}*.py"}, "No files found") for n in ("conf", "cfg")]
        + [ok("grep", {"pattern": "settings"}, "src/app/settings.py:3: settings = {}")]
        + [read(f"src/app/{m}.py") for m in ("settings", "main", "db", "cli")]
        + [ok("grep", {"pattern": "DEBUG"}, "No files found")]
        + [ok("grep", {"pattern": "environ"}, "src/app/main.py:9: os.environ")]
        + [edit("src/app/settings.py", "settings = {}", "settings = load()")],
    ),
    # --- a call that runs away (rule `runaway`) -------------------------------------------------
    # The real local model's answer to the feedback (../shared/realmodel): one bash call
    # printing the same line for ever, its `running` update re-sent with each few lines. The
    # trace ends where bash's timeout would (2 minutes in); the rule stops it at its 20th
    # update whose last 20 lines are that line.
    "w-runaway-while-true": (
        "loop at 2",
        [
            sh("ls", "README.md\nsrc"),
            streams(
                "bash -c 'while true; do echo \"Loop guard: stop\"; sleep 0.01; done'",
                ["Loop guard: stop"] * 80,
                2,
                143,
            ),
        ],
    ),
    # A long build streaming a new line at each update, and a test run that prints a block
    # of 30 equal dots lines once, then its summary: they end, or move on.
    "w-legit-long-streams": (
        "legit",
        [
            streams("make -j2", [f"CC src/module_{n}.o" for n in range(150)], 3),
            streams(
                "pytest -q",
                [f"tests/test_{n}.py ...." for n in range(20)]
                + ["...................."] * 30
                + ["150 passed in 9.1s"],
                1,
            ),
        ],
    ),
    # --- waiting -----------------------------------------------------------------------------
    "w-legit-ci-polling": (
        "legit",
        [sh("sleep 30 && gh run view 4711", "status: in_progress")] * 12
        + [sh("sleep 30 && gh run view 4711", "status: completed, conclusion: success")],
    ),
    "w-legit-status-answered-in-progress": (
        "legit",
        [sh("kubectl rollout status deploy/web", "Waiting for rollout: 1 of 3 updated")] * 6
        + [sh("kubectl rollout status deploy/web", "deployment successfully rolled out")],
    ),
    "w-legit-health-and-log-in-turn": (
        "legit",
        [
            c
            for n in range(8)
            for c in (
                sh("curl -s localhost:8080/health", "starting"),
                sh("tail -n 5 server.log", f"line {n}"),
            )
        ],
    ),
    "w-wait-never-ends": (
        "loop at 20",
        [sh("sleep 60 && gh run view 99", "status: queued")] * 24,
    ),
    "w-wait-same-failure": (
        "loop at 4",
        [fails("sleep 5 && curl -sf localhost:9/health", "curl: (7) Failed to connect", 7)] * 6,
    ),
    "w-legit-wait-for-server": (
        "legit",
        [sh("sleep 2 && curl -s localhost:3000/health", "not ready")] * 5
        + [sh("sleep 2 && curl -s localhost:3000/health", "ok")],
    ),
}


# Issue 44's other shapes: a change that failed, a check stalled while the tests move, a read
# that creeps.
TRACES |= {
    # Writes refused ("File already exists") and edits whose old text was not found between
    # the runs of a check: nothing changed, the reruns are plain reruns.
    "w-legit-refused-changes-between-checks": (
        "legit",
        [
            edit("src/calc.py", "    c = 0", "    c = 1"),
            fails("pytest -q", PYTEST_FAIL.format(3, 1)),
        ]
        + [
            c
            for n in range(6)
            for c in (
                error(
                    "write",
                    {"filePath": "src/calc.py", "content": f"c = {n + 2}\n"},
                    "File already exists: src/calc.py. Cannot overwrite",
                )
                if n % 2
                else error(
                    "edit",
                    {"filePath": "src/calc.py", "oldString": "    c = 0", "newString": f"c = {n}"},
                    "oldString not found in content",
                ),
                fails("pytest -q", PYTEST_FAIL.format(3, 1)),
            )
        ],
    ),
    # A debugging script that prints before the value it shows is computed, run after each
    # edit, while the tests between its runs go from failing to passing and back.
    "w-legit-debug-script-while-tests-move": (
        "legit",
        [
            c
            for n in range(8)
            for c in (
                edit("src/calc.py", f"    d = {n}", f"    d = {n + 1}"),
                sh("python3 debug.py", "value: None"),
                fails("pytest -q", PYTEST_FAIL.format(3, 1))
                if n % 2
                else sh("pytest -q", "3 passed"),
            )
        ],
    ),
    # One function read again and again through windows that creep around it, nothing changed.
    "w-revisit-creeping-read": (
        "loop at 4",
        [
            ok("read", {"filePath": "src/calc.py", "offset": o, "limit": n}, f"<file>{o}</file>")
            for o, n in ((120, 40), (118, 40), (120, 50), (121, 40), (119, 45), (122, 40))
        ],
    ),
}


def main() -> None:
    for name, (label, calls) in TRACES.items():
        body = "".join(f"data: {json.dumps(f)}\n\n" for f in frames(f"ses_{name[2:]}", calls))
        (HERE / f"{name}.sse").write_text(f": expect {label}\n\n{body}")


if __name__ == "__main__":
    main()
