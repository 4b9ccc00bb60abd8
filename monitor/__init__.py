"""opencode-loop-monitor: stop AI coding agents that loop on tool calls."""

__version__ = "0.1.0"
