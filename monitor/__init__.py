"""opencode-loop-monitor: stop AI coding agents that loop on tool calls.

Three parts: `monitor.core` decides (pure: frames in, decisions out), `monitor.shell` acts
(asyncio: the event stream, the server's API, the daemon), `monitor.kit` demonstrates and
tests (a real server in a sandbox, a scripted model). The names below are the core's public
surface, enough to run the detection over frames of your own:

    tracker = Tracker(Detection(repeats=3))
    for data in frames:
        for decision in tracker.feed_data(data).decisions:
            print(decision.rule, decision.session_id, decision.feedback)
"""

__version__ = "0.1.0"

from monitor.core.tracker import Detection, Fed, Intervene, Tracker  # noqa: E402

__all__ = ["Detection", "Fed", "Intervene", "Tracker", "__version__"]
