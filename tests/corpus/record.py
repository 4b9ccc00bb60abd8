"""Record the corpus traces that come from the real server: `python -m tests.corpus.record`.

Each trace is one session of a real, isolated `opencode serve` driven by the scripted model
(monitor/kit), its `/event` stream written as the server sent it, after a first comment line
with its label (`: expect loop at N` or `: expect legit`, see monitor/core/evaluate.py).
Paths are rewritten to /home/dev/project as in ../shared/opencode/captures. It runs the
opencode the real-server tests run (OPENCODE_BIN, or the shared cache). Run it again only
to refresh the recordings; the corpus test reads the files. `tests.corpus.record_text`
records its traces the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import aiohttp

from monitor.kit.sandbox import OpencodeServer, default_cache_dir, find_or_install_opencode
from monitor.kit.scripted_model import ScriptedModel, script

HERE = Path(__file__).parent

NOT_THERE = "ls: cannot access 'no-such-dir': No such file or directory"
# A job that reports in_progress the first five times it is asked, then completed.
POLL = (
    "sleep 0.2; n=$(cat .job 2>/dev/null || echo 0); echo $((n+1)) > .job; "
    'if [ "$n" -lt 5 ]; then echo "status: in_progress"; else echo "status: completed"; fi'
)


def bash(command: str, description: str = "Run a command") -> tuple[str, dict]:
    return ("bash", {"command": command, "description": description})


def read(path: str) -> tuple[str, dict]:
    return ("read", {"filePath": path})


def write(path: str, content: str) -> tuple[str, dict]:
    return ("write", {"filePath": path, "content": content})


def todo(step: int) -> tuple[str, dict]:
    todos = [
        {"content": f"fix build (attempt {step})", "status": "in_progress", "priority": "high"},
        {"content": "run tests", "status": "pending", "priority": "medium"},
    ]
    return ("todowrite", {"todos": todos})


def _test_file(version: int) -> str:
    # Fails with the same assertion the first three versions, passes at the fourth.
    expected = 4 if version == 4 else 5
    return f"def add(a, b):\n    return a + b\n\nassert add(2, 2) == {expected}, 'add is wrong'\n"


def _routine(name: str) -> list[tuple[str, dict]]:
    return [
        read(f"{name}.txt"),
        bash(f"wc -l {name}.txt", "Count lines"),
        write(f"{name}.bak", f"backup of {name}\n"),
        bash(f"diff {name}.txt {name}.bak || true", "Compare with backup"),
        bash(f"git add {name}.bak", "Stage backup"),
    ]


SETUP = bash(
    "for n in a b c d e f g h i j k l; do echo $n > $n.txt; done; git add -A && "
    "git -c user.name=x -c user.email=x@localhost commit -qm files",
    "Create files",
)

TRACES: dict[str, tuple[str, list[tuple[str, dict]]]] = {
    "failure-rewritten-command": (
        "loop at 4",
        [
            bash("ls no-such-dir", "List dir"),
            bash("ls -l no-such-dir", "List dir in long form"),
            bash("cd . && ls no-such-dir", "List from project root"),
            bash("ls -a no-such-dir", "List all entries"),
            bash("LC_ALL=C ls no-such-dir", "List with C locale"),
        ],
    ),
    "relabelled-retry": (
        "loop at 4",
        [bash("git status --short", f"Check status, try {n}") for n in range(1, 7)],
    ),
    "tests-after-distinct-edits": (
        "legit",
        [
            item
            for version in (1, 2, 3, 4)
            for item in (
                write("test_add.py", _test_file(version) + f"# version {version}\n"),
                bash("python3 test_add.py", "Run the test"),
            )
        ],
    ),
    "polling-until-done": ("legit", [bash(POLL, "Poll the job")] * 7),
    "polling-forever": (
        "loop at 20",
        [bash("sleep 0.1 && echo 'status: in_progress'", "Wait for the job")] * 22,
    ),
    "wait-same-failure": (
        "loop at 4",
        [bash("sleep 0.1 && cat /nonexistent/status", "Wait for status")] * 6,
    ),
    "routine-over-files": (
        "legit",
        [SETUP] + [step for name in ("a", "b", "c") for step in _routine(name)],
    ),
    "routine-same-file": (
        "loop at 15",
        [step for _ in range(4) for step in _routine("README")],
    ),
    "reads-of-different-files": (
        "legit",
        [SETUP] + [read(f"{name}.txt") for name in "abcdefghijkl"],
    ),
    "retry-between-todo-updates": (
        "loop at 4",
        [item for step in range(1, 6) for item in (todo(step), read("missing.md"))],
    ),
}


async def _collect(http: aiohttp.ClientSession, url: str, directory: str, into: list[str]) -> None:
    async with http.get(url + "/event", params={"directory": directory}) as response:
        async for line in response.content:
            text = line.decode()
            if text.startswith("data:"):
                into.append(text.rstrip("\n"))


async def record(name: str, label: str, prompt: str) -> None:
    """Record one session that `prompt` starts as `HERE/name.sse`, labelled `label`."""
    binary = find_or_install_opencode(default_cache_dir())
    async with ScriptedModel() as model, OpencodeServer(binary, model.url) as server:
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            frames: list[str] = []
            reader = asyncio.create_task(_collect(http, server.url, server.directory, frames))
            await asyncio.sleep(0.5)
            client = server.client(http)
            session = await client.create_session(name)
            await client.prompt_async(session["id"], prompt)
            await client.wait_idle(session["id"], timeout=120)
            await asyncio.sleep(0.5)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        text = "\n\n".join(frames).replace(server.directory, "/home/dev/project")
        text = text.replace(json.dumps(server.directory)[1:-1], "/home/dev/project")
        (HERE / f"{name}.sse").write_text(f": expect {label}\n\n{text}\n\n")
        print(name, len(frames), "frames")


async def record_all(traces: dict[str, tuple[str, str]]) -> None:
    """Record every trace (name: label, prompt), or only the one named by `$TRACE`."""
    only = os.environ.get("TRACE")
    for name, (label, prompt) in traces.items():
        if only is None or only == name:
            await record(name, label, prompt)


if __name__ == "__main__":
    prompts = {name: (label, script(calls, len(calls))) for name, (label, calls) in TRACES.items()}
    asyncio.run(record_all(prompts))
