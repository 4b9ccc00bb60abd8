"""The OpenCode tool profile: what of a call is noise, and which tools are bookkeeping.

Decided from the tools' schemas (`GET /experimental/tool` on opencode 1.18.33) and what models
send (the recordings in ../shared/opencode/captures):

- Label arguments describe a call to the person watching and change with every retry of the
  same thing: bash's `description` (not in the 1.18.33 schema, but models still send it, see
  the capture `bash-exit-codes`: "List missing dir", then "List the missing dir again"),
  task's `description` ("A short (3-5 words) description of the task").
- Volatile arguments tune how a call runs, not what it does: bash's `timeout` and
  webfetch's `timeout`. A model that raises the timeout and runs the same command again is
  retrying it.
- Bookkeeping tools (`todowrite`, and `todoread` of older servers) update the model's own
  notes; between two retries they mean nothing, so they are transparent: not recorded, and
  they neither break a cycle nor a run of failures.

Everything else is compared exactly; `workdir`, `offset`, `limit`, `replaceAll` change what
a call does.

OpenCode 2 renamed tools and keys (../shared/opencode/V2-NOTES.md): `shell` is bash,
`subagent` is task, and the file tools take `path` where 1.x took `filePath` (seen on the real
1.18.33's new engine: `read` refuses `filePath` there). `server_call` gives a 2.x call its 1.x
name and keys, so that the profile, the rules that know a tool (bash's exit status, its sleeps,
the file-changing tools) and the signature treat one loop alike whichever engine ran it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

__all__ = [
    "ENGINE_NAMES",
    "NO_NAMES",
    "Profile",
    "ignored_args",
    "server_call",
    "transparent_tools",
]

Profile = Literal["opencode", "none"]

OPENCODE_TRANSPARENT_TOOLS = frozenset({"todowrite", "todoread"})
OPENCODE_IGNORED_ARGS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "bash": frozenset({"description", "timeout"}),
        "task": frozenset({"description"}),
        "webfetch": frozenset({"timeout"}),
    }
)


# 2.x tool name -> the 1.x name the profile and the rules know. Plain dicts, private to
# `server_call`: it runs on every call's update, and a mapping proxy's look-up costs more.
_TOOL_NAMES = {"shell": "bash", "subagent": "task"}
# The 1.x name -> the new engine's: how the texts a model of that engine reads name its tools.
ENGINE_NAMES: Mapping[str, str] = MappingProxyType({v: k for k, v in _TOOL_NAMES.items()})
NO_NAMES: Mapping[str, str] = MappingProxyType({})
# Per (1.x) tool, 2.x argument key -> 1.x key. Only the file tools: glob's and grep's `path`
# is a folder in 1.x too, and stays.
_ARG_KEYS = {tool: {"path": "filePath"} for tool in ("read", "write", "edit")}


def server_call(tool: str, args: object) -> tuple[str, object]:
    """A 2.x call under its 1.x name and argument keys; a 1.x call comes back as it is."""
    tool = _TOOL_NAMES.get(tool, tool)
    keys = _ARG_KEYS.get(tool)
    if keys is not None and type(args) is dict and not keys.keys().isdisjoint(args):
        args = {keys.get(key, key): value for key, value in args.items()}
    return tool, args


def transparent_tools(profile: Profile, extra: frozenset[str]) -> frozenset[str]:
    """Tools never recorded: the profile's bookkeeping tools and the user's own."""
    return extra | OPENCODE_TRANSPARENT_TOOLS if profile == "opencode" else extra


def ignored_args(
    profile: Profile, extra: Mapping[str, frozenset[str]] | None
) -> dict[str, frozenset[str]]:
    """Argument keys dropped before comparing, per tool: the profile's and the user's."""
    merged = dict(OPENCODE_IGNORED_ARGS) if profile == "opencode" else {}
    for tool, keys in (extra or {}).items():
        merged[tool] = merged.get(tool, frozenset()) | keys
    return merged
