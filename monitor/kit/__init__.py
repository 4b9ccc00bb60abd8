"""The demo and test kit: a real `opencode serve` isolated on loopback (`sandbox`), a scripted
OpenAI-compatible model that drives it (`scripted_model`), and the `demo` command.

Not part of the guard: nothing in `monitor.core` or `monitor.shell` imports it.
"""
