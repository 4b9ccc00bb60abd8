"""The pure core: data in, decisions out. No socket, no event loop, no clock.

A frame travels through these modules in order: `frames` (SSE bytes to JSON), `events`
(typed events), `profile` and `signature` (what makes two calls the same), `session` (one
record per session), `rules` (one module per loop rule), `findings` (what a rule found),
`tracker` (the policy: events to decisions), `feedback` (what the model reads). `resync`
plans what to read back after a reconnect; `export` turns a session's messages into the frames
the stream would have carried; `replay` and `evaluate` run the tracker over recordings.
"""

__all__: list[str] = []
