"""The asyncio shell: moves bytes, runs timers and calls the server's API.

`stream` reads the event feed, `follow` feeds it to the core's `Monitor` and hands its
commands to `executor`, whose `actions` call `api`. `attach` is `watch` filtered to one
session. `notify`, `metrics` and `logs` tell systemd, Prometheus and the journal how it goes;
`replay` runs the core over recordings, offline.
"""

__all__: list[str] = []
