"""The demo and test kit: a real `opencode serve` isolated on loopback (`sandbox`), a scripted
OpenAI-compatible model that drives it (`scripted_model`), the `demo` command, the `playground`
and the one polling helper (`poll`). The stand-in server is `monitor.testing`.

Not part of the guard: nothing in `monitor.core` or `monitor.shell` imports it.
"""

__all__: list[str] = []
