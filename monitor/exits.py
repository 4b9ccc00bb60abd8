"""Every exit status the monitor's commands return, in one place (`os.EX_*` where one exists).

Each name means one thing: `EX_DETECTED` (replay found a loop and was asked to fail then) and
`EX_MISJUDGED` (evaluate found a trace whose verdict is wrong) share the value 1 that scripts
test for, but not a name.
"""

from __future__ import annotations

import os

__all__ = [
    "EX_CONFIG",
    "EX_DETECTED",
    "EX_FAILED",
    "EX_INTERRUPTED",
    "EX_MISJUDGED",
    "EX_NOINPUT",
    "EX_NOT_INSTALLED",
    "EX_OK",
    "EX_OTHER_RELEASE",
    "EX_OTHER_SERVER",
    "EX_PIPE",
    "EX_UNAVAILABLE",
    "EX_USAGE",
]

EX_OK = os.EX_OK
EX_DETECTED = 1  # replay --fail-on-detect, and a loop was detected
EX_MISJUDGED = 1  # evaluate: a labelled trace was missed, caught early or late, or a false alarm
EX_FAILED = 1  # demo, playground, model: what they started failed (the server, the model, a run)
EX_USAGE = 2  # a file could not be read or is not a recording (InputError); argparse's own code
EX_NOT_INSTALLED = 3  # plugin status: no plugin of ours in the folder
EX_OTHER_SERVER = 4  # plugin status: a monitor answers the plugin, not the one of --url
# plugin status: the plugin file, this command and the monitor are not of one release, or the
# monitor refuses the plugin's questions
EX_OTHER_RELEASE = 5
EX_NOINPUT = os.EX_NOINPUT  # attach: the session does not exist
EX_UNAVAILABLE = os.EX_UNAVAILABLE  # ServerError; plugin status: the monitor cannot be asked
EX_CONFIG = os.EX_CONFIG  # a setting is wrong: no retry (monitor/errors.py)
EX_INTERRUPTED = 130  # 128 + SIGINT
EX_PIPE = 141  # 128 + SIGPIPE: what a shell reports when the reader of the output left
