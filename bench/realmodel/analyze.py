"""Figures per arm from `bench.realmodel.run`'s output: OUT/results.json, the recordings (and the
sessions' messages), the monitors' JSON logs and the proxy's step logs. Writes OUT/analysis.json
(every run, and the totals per arm) and OUT/analysis.md (the table per arm, then each run).

    python -m bench.realmodel.analyze --out OUT

Definitions (the same for every arm, revision and seed):
- call: a tool part in the session's event stream (first appearance orders them; the last
  update of a part is its final state). Its key: tool and input, bash's `description` and
  `timeout` left out (as the monitor's `opencode` profile does).
- refused in band: its error carries one of the marks the guard ever used
  (`monitor.core.feedback.MARKS`): the plugin threw it, the call did not run. executed: every
  other call (an aborted call had started).
- loop calls executed: executed calls whose key an earlier call of the session had.
- model steps: assistant messages. work time: from the prompt to the end of the session's last
  message (run.py's `work_seconds`).
- tokens: OpenCode's per-step `tokens` summed (prompt: input + cache read; output);
  llama-server's own count of new prompt tokens processed (`prompt_n`, after its cache) and
  generated tokens (`predicted_n`) from the proxy's step log, for the steps that ended inside the
  run's time window.
- intervention: a `loop.detected` in the arm's monitor log; its outcome from the matching
  `intervention.outcome`; holds: interventions whose outcome is `held`. The named block: the
  `cycle_length` calls ending at the call it names. feedback messages: user messages carrying
  a mark.
- the model's reaction to an intervention: its next action in the steps that began after the
  step holding the named call (calls later in that same step were written before the
  intervention and are counted apart, `same_step_after`). The first step with a call gives the
  class of its first call, in this order: `same` (the named call's key), `other-in-loop` (another
  key of the named block), `guard-name` (a tool the agent does not have whose name contains
  "loop", "guard" or "monitor"), `no-such-tool` (any other tool the agent does not have: not in
  run's agent tools, or what OpenCode records as `invalid`, whose input names the tool the model
  asked for), `changed` (an existing tool outside the block: a real change of approach). A step
  with text and no call before it: `text`. No later step that acts: `held` when the session was
  held at or after this intervention, else `nothing`. The table's "no such tool" counts
  `guard-name` too. A text loop (it names a text part) has no named call: a call to an existing
  tool after it is `changed`. An intervention whose part is in no step: `unmatched`.
- tasks completed: run.py's mechanical check of the project folder after the run (typo:
  README.md says "library" and not "libary"; version: VERSION is "0.2.0" with or without a
  newline; tests: `python3 -m unittest` passes in the folder; summary: the last assistant text
  of the session mentions "calc", as in "calculator").
- arm A: `opencode-loop-monitor replay` of its recordings (this tree's monitor) says where the
  guard would have acted (`would_detect`, per run only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from monitor.core.feedback import MARKS

REACTIONS = (
    "same",
    "other-in-loop",
    "guard-name",
    "no-such-tool",
    "changed",
    "text",
    "held",
    "nothing",
)
GUARD_WORDS = ("loop", "guard", "monitor")
# Arguments left out of comparisons, as the monitor's `opencode` profile does (a label, and a
# timeout that tunes how a call runs, not what it does).
VOLATILE = {"bash": {"description", "timeout"}, "webfetch": {"timeout"}}


# ---------------------------------------------------------------- pure parts


def carries_mark(text: str) -> bool:
    """Whether a call's error (a refusal) or a user message (feedback) is the guard's."""
    return any(mark in text for mark in MARKS)


def key(tool: str, inp: object) -> str:
    if isinstance(inp, dict) and tool in VOLATILE:
        inp = {k: v for k, v in inp.items() if k not in VOLATILE[tool]}
    return json.dumps([tool, inp], sort_keys=True)


def asked_tool(tool: str, inp: object) -> str:
    """The tool the model asked for: OpenCode records a call to an unknown tool as `invalid`,
    the name asked for in its input."""
    if tool == "invalid" and isinstance(inp, dict) and isinstance(inp.get("tool"), str):
        return str(inp["tool"])
    return tool


def call_class(
    call: dict[str, Any], named: str, block: set[str], tools: Iterable[str] | None
) -> str:
    """A call made after an intervention: see the module's definitions."""
    k = key(call["tool"], call.get("input"))
    if k == named:
        return "same"
    if k in block:
        return "other-in-loop"
    available = call["tool"] != "invalid" and (tools is None or call["tool"] in tools)
    if available:
        return "changed"
    name = asked_tool(call["tool"], call.get("input")).lower()
    return "guard-name" if any(w in name for w in GUARD_WORDS) else "no-such-tool"


def reaction(
    named: str,
    block: set[str],
    later: Sequence[tuple[Sequence[dict[str, Any]], str]],
    tools: Iterable[str] | None,
    held: bool,
) -> str:
    """The model's next action: `later` is each step after the named call's (its calls, its
    text)."""
    for calls, text in later:
        if calls:
            return call_class(calls[0], named, block, tools)
        if text.strip():
            return "text"
    return "held" if held else "nothing"


def final_text(msgs: list[dict[str, Any]]) -> str:
    """The last assistant text of a session (OpenCode's messages: `info` and `parts`)."""
    for m in reversed(msgs):
        if m["info"].get("role") != "assistant":
            continue
        text = "".join(p.get("text", "") for p in m["parts"] if p.get("type") == "text")
        if text.strip():
            return text
    return ""


def task_completed(task: str, folder: Path, final: str) -> bool:
    """The task's mechanical check on its project folder after the run."""
    if task == "typo":
        readme = read(folder / "README.md")
        return "library" in readme and "libary" not in readme
    if task == "version":
        return read(folder / "VERSION") in ("0.2.0\n", "0.2.0")
    if task == "tests":
        test = ["nice", "-n", "10", "python3", "-m", "unittest"]
        try:
            done = subprocess.run(test, cwd=folder, capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0
    if task == "summary":
        return "calc" in final.lower()
    raise ValueError(f"no check for task {task!r}")


def read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


# ---------------------------------------------------------------- reading the recordings


def frames(path: Path) -> list[dict[str, Any]]:
    out = []
    for block in path.read_bytes().decode("utf-8", "replace").split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                try:
                    out.append(json.loads(line[6:]))
                except ValueError:
                    pass
    return out


def calls_of(
    fr: list[dict[str, Any]], sid: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The session's calls (final state, in order of first appearance) and messages."""
    parts: dict[str, dict[str, Any]] = {}
    msgs: dict[str, dict[str, Any]] = {}
    texts: dict[str, dict[str, str]] = {}
    for f in fr:
        t, p = f.get("type"), f.get("properties", {})
        if t == "message.part.updated" and p["part"].get("sessionID") == sid:
            part = p["part"]
            if part.get("type") == "tool":
                parts[part["id"]] = part
            elif part.get("type") == "text":
                texts.setdefault(part["messageID"], {})[part["id"]] = part.get("text", "")
        elif t == "message.updated" and p["info"].get("sessionID") == sid:
            msgs[p["info"]["id"]] = p["info"]
    messages = [
        {
            "id": mid,
            "role": info["role"],
            "tokens": info.get("tokens") or {},
            "error": (info.get("error") or {}).get("name"),
            "finish": info.get("finish"),
            "text": "".join(texts.get(mid, {}).values()),
            "text_parts": list(texts.get(mid, {})),
            "step": n,
        }
        for n, (mid, info) in enumerate(msgs.items())
    ]
    index = {m["id"]: i for i, m in enumerate(messages)}
    calls = []
    for pid, part in parts.items():
        st = part["state"]
        err = st.get("error") or ""
        refused = carries_mark(err)
        calls.append(
            {
                "part_id": pid,
                "call_id": part.get("callID"),
                "tool": part["tool"],
                "input": st.get("input"),
                "key": key(part["tool"], st.get("input")),
                "status": st["status"],
                "refused": refused,
                "aborted": not refused and "abort" in err.lower(),
                "executed": not refused,
                "message": part["messageID"],
                "step": index.get(part["messageID"], -1),
            }
        )
    return calls, messages


def monitor_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and "event" in e:
            out.append(e)
    return out


def find_call(calls: list[dict[str, Any]], e: dict[str, Any]) -> int | None:
    for i, c in enumerate(calls):
        if (e.get("call_id") and c["call_id"] == e["call_id"]) or c["part_id"] == e.get("part_id"):
            return i
    return None


def replay(path: Path) -> list[dict[str, Any]]:
    """What this tree's monitor finds offline in a recording (arm A: where it would have acted)."""
    cmd = [sys.executable, "-m", "monitor", "replay", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    found = []
    for line in out.stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("event") == "loop.detected":
            found.append(e)
    return found


def short(c: dict[str, Any]) -> str:
    inp = c["input"] or {}
    arg = inp.get("filePath") or inp.get("command") or inp.get("tool") or json.dumps(inp)[:60]
    if c["tool"] == "edit":
        old, new = json.dumps(inp.get("oldString"))[:25], json.dumps(inp.get("newString"))[:25]
        arg = f"{inp.get('filePath')} {old}->{new}"
    if c["tool"] == "write":
        arg = f"{inp.get('filePath')} {json.dumps(inp.get('content'))[:30]}"
    return f"{c['tool']}({str(arg)[:70]})"


# ---------------------------------------------------------------- per run


def same_loop(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("part_id"), a.get("call_index")) == (b.get("part_id"), b.get("call_index"))


def interventions_of(
    calls: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    ev: list[dict[str, Any]],
    tools: list[str] | None,
) -> list[dict[str, Any]]:
    """Each `loop.detected` of the session with its outcome and the model's reaction."""
    detected = [e for e in ev if e["event"] == "loop.detected"]
    outcomes = [e for e in ev if e["event"] == "intervention.outcome"]
    ends = [next((o for o in outcomes if same_loop(o, d)), {}) for d in detected]
    found = []
    for n, (d, o) in enumerate(zip(detected, ends, strict=True)):
        iv = {k: d.get(k) for k in ("rule", "finding", "call_index", "plan", "channel", "via")}
        iv.update(outcome=o.get("outcome"), reason=o.get("reason"), abort_ms=o.get("abort_ms"))
        i = find_call(calls, d)
        # A text loop names a text part: its step, and no call that could be "the same".
        step = next((m["step"] for m in messages if d.get("part_id") in m["text_parts"]), None)
        named, block = "", set()
        if i is not None:
            step, named, cycle = calls[i]["step"], calls[i]["key"], d.get("cycle_length") or 1
            block = {c["key"] for c in calls[max(0, i - cycle + 1) : i + 1]}
            iv["named"] = short(calls[i])
            iv["same_step_after"] = sum(c["step"] == step for c in calls[i + 1 :])
        if step is None:
            found.append({**iv, "call": None, "reaction": "unmatched"})
            continue
        later = [
            ([c for c in calls if c["step"] == m["step"]], m["text"])
            for m in messages[step + 1 :]
            if m["role"] == "assistant"
        ]
        held = any(e.get("outcome") == "held" for e in ends[n:])
        iv.update(
            call=None if i is None else i + 1,
            reaction=reaction(named, block, later, tools, held),
            next=next((short(cs[0]) for cs, _ in later if cs), None),
        )
        found.append(iv)
    return found


def analyze_run(run: dict[str, Any], out: Path, tools: list[str] | None) -> dict[str, Any]:
    sid = run["session"]
    rec = out / "recordings" / run["recording"]
    calls, messages = calls_of(frames(rec), sid)
    seen: set[str] = set()
    for c in calls:
        c["repeat"] = c["key"] in seen
        seen.add(c["key"])
    mlog = run.get("monitor_log")
    ev = [e for e in monitor_events(out / mlog) if e.get("session_id") == sid] if mlog else []
    ivs = interventions_of(calls, messages, ev, tools)
    assistant = [m for m in messages if m["role"] == "assistant"]
    proxy = [json.loads(x) for x in read(out / run["model_steps"]).splitlines() if x.strip()]
    win = [s for s in proxy if "t" in s and run["t0"] <= s["t"] <= run["t_end"] + 1]
    tokens = [m["tokens"] for m in assistant]
    would = []
    if run["arm"] == "A":
        for e in replay(rec):
            i = find_call(calls, e)
            would.append({"call": None if i is None else i + 1, "rule": e.get("rule")})
    return {
        "task": run["task"],
        "arm": run["arm"],
        "seed": run["seed"],
        "session": sid,
        "outcome": run["outcome"],
        "completed": run.get("completed"),
        "work_s": run.get("work_seconds") or 0,
        "steps": len(assistant),
        "calls": len(calls),
        "executed": sum(c["executed"] for c in calls),
        "refused": sum(c["refused"] for c in calls),
        "aborted_calls": sum(c["aborted"] for c in calls),
        "loop_executed": sum(c["repeat"] and c["executed"] for c in calls),
        "tokens_prompt": sum(
            (t.get("input") or 0) + ((t.get("cache") or {}).get("read") or 0) for t in tokens
        ),
        "tokens_out": sum(t.get("output") or 0 for t in tokens),
        "llama_prompt_new": sum((s.get("timings") or {}).get("prompt_n", 0) for s in win),
        "llama_generated": sum((s.get("timings") or {}).get("predicted_n", 0) for s in win),
        "interventions": ivs,
        "holds": sum(iv.get("outcome") == "held" for iv in ivs),
        "loop_again": sum(e["event"] == "loop.again" for e in ev),
        "feedback_msgs": sum(m["role"] == "user" and carries_mark(m["text"]) for m in messages),
        "would_detect": would,
        "trace": [
            f"{n + 1:>2} s{c['step']:<2} {short(c)}"
            f"{' REFUSED' if c['refused'] else ''}{' ABORTED' if c['aborted'] else ''}"
            f"{' rep' if c['repeat'] else ''}"
            for n, c in enumerate(calls)
        ],
        "diff": run.get("diff"),
    }


# ---------------------------------------------------------------- per arm


SUMS = (
    "steps",
    "calls",
    "executed",
    "refused",
    "loop_executed",
    "work_s",
    "tokens_prompt",
    "tokens_out",
    "llama_prompt_new",
    "llama_generated",
    "holds",
    "feedback_msgs",
)


def per_arm(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ivs = [iv for r in rows for iv in r["interventions"]]
    reactions = Counter(iv["reaction"] for iv in ivs)
    total: dict[str, Any] = {"runs": len(rows)}
    total.update({k: round(sum(r[k] for r in rows), 1) for k in SUMS})
    total.update(
        completed=sum(bool(r["completed"]) for r in rows),
        interventions=len(ivs),
        outcomes=dict(sorted(Counter(str(iv.get("outcome")) for iv in ivs).items())),
        reactions={k: reactions[k] for k in (*REACTIONS, "unmatched") if reactions[k]},
    )
    return total


def table(order: list[str], arms: dict[str, dict[str, Any]]) -> list[str]:
    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(str(cell(arms[a])) for a in order) + " |"

    def reacted(t: dict[str, Any], *names: str) -> int:
        return sum(t["reactions"].get(n, 0) for n in names)

    return [
        "| | " + " | ".join(order) + " |",
        "|---|" + "---|" * len(order),
        row("runs", lambda t: t["runs"]),
        row(
            "calls made / executed / refused in band",
            lambda t: f"{t['calls']} / {t['executed']} / {t['refused']}",
        ),
        row("loop calls executed", lambda t: t["loop_executed"]),
        row("model steps / work time", lambda t: f"{t['steps']} / {t['work_s']:.0f} s"),
        row(
            "OpenCode tokens (prompt + output)",
            lambda t: f"{t['tokens_prompt']} + {t['tokens_out']}",
        ),
        row(
            "llama-server tokens (new prompt + generated)",
            lambda t: f"{t['llama_prompt_new']} + {t['llama_generated']}",
        ),
        row(
            "interventions (by outcome)",
            lambda t: f"{t['interventions']} {t['outcomes'] or ''}".strip(),
        ),
        row("holds", lambda t: t["holds"]),
        row(
            "next action: same / other in loop",
            lambda t: f"{reacted(t, 'same')} / {reacted(t, 'other-in-loop')}",
        ),
        row(
            "next action: no such tool (guard's name)",
            lambda t: f"{reacted(t, 'no-such-tool', 'guard-name')} ({reacted(t, 'guard-name')})",
        ),
        row("next action: changed approach", lambda t: reacted(t, "changed")),
        row(
            "next action: text / held / nothing",
            lambda t: f"{reacted(t, 'text')} / {reacted(t, 'held')} / {reacted(t, 'nothing')}",
        ),
        row("tasks completed", lambda t: f"{t['completed']} of {t['runs']}"),
    ]


def run_details(r: dict[str, Any]) -> list[str]:
    head = (
        f"## {r['task']} / {r['arm']} / seed {r['seed']}: {r['outcome']}, {r['work_s']} s, "
        f"{r['steps']} steps, {r['calls']} calls, completed {r['completed']}"
    )
    if r["arm"] == "A":
        head += f"; replay would detect: {r['would_detect']}"
    md = [head]
    for iv in r["interventions"]:
        md.append(
            f"- {iv['rule']} '{iv['finding']}' on call {iv['call']}: plan {iv['plan']} via "
            f"{iv['channel']} -> {iv['outcome']} {iv.get('reason') or ''}; named "
            f"{iv.get('named')}; next {iv.get('next')}: {iv['reaction']}"
        )
    return [*md, "```", *r["trace"], f"--- diff: {r['diff']!r}", "```"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.realmodel.analyze",
        description="Figures per arm from a bench.realmodel.run study (definitions: "
        "this module's docstring, docs/realmodel.md).",
    )
    ap.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the study's --out folder; analysis.json and analysis.md are written there",
    )
    out = ap.parse_args(argv).out
    results = json.loads((out / "results.json").read_text())
    rows = [analyze_run(r, out, results.get("agent_tools")) for r in results["runs"]]
    order = [a for a in results["arm_order"] if any(r["arm"] == a for r in rows)]
    arms = {a: per_arm([r for r in rows if r["arm"] == a]) for a in order}
    meta = {k: results.get(k) for k in ("monitors", "seeds", "tasks", "agent", "agent_tools")}
    (out / "analysis.json").write_text(json.dumps({**meta, "arms": arms, "runs": rows}, indent=1))
    md = [
        "# A real local model: figures per arm",
        "",
        f"Seeds {results['seeds']}, tasks {results['tasks']}, agent {results['agent']}; monitors:",
        *(f"- {a}: {m['source']} ({m['version']})" for a, m in results["monitors"].items()),
        "",
        *table(order, arms),
        "",
    ]
    for r in sorted(rows, key=lambda r: (r["seed"], r["task"], order.index(r["arm"]))):
        md += [*run_details(r), ""]
    (out / "analysis.md").write_text("\n".join(md))
    print("\n".join(table(order, arms)))


if __name__ == "__main__":
    main()
