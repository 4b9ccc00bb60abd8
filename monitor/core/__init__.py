"""The pure core: data in, decisions out. No socket, no event loop, no clock.

A frame travels through these modules in order: `frames` (SSE bytes to JSON), `events`
(typed events), `signature` (what makes two calls the same), `guard` (per-session history),
`rules` (one module per loop rule), `tracker` (the policy: events to decisions), `feedback`
(what the model reads). `resync` plans what to read back after a reconnect; `export` turns a
session's messages into the frames the stream would have carried.
"""
