"""What delivery relies on, checked on the real `opencode serve`.

The monitor decides whether an unanswered feedback arrived by finding its exact text among
the session's messages (`feedback_delivered`), and sends ids in percent-encoded paths: both
only work if the server stores the text as sent and takes the encoded paths.
"""

from __future__ import annotations

import pytest

from monitor.core.export import feedback_delivered
from monitor.core.feedback import MARK
from monitor.core.ids import is_session_id
from monitor.kit.poll import until
from monitor.shell.api import OpencodeAPI, Retry

pytestmark = pytest.mark.real_server


async def test_the_server_stores_feedback_verbatim_and_takes_encoded_paths(opencode_server, http):
    client = opencode_server.client(http)
    session = await client.create_session("delivery")
    assert is_session_id(session["id"])
    api = OpencodeAPI(http, opencode_server.url, Retry(attempts=1, timeout=10))
    directory = opencode_server.directory
    text = f"{MARK}1 call (read) repeated 4 times.\n\n  Trailing spaces, ünïcödé, tabs\t \n"
    assert not feedback_delivered(await api.messages(session["id"], directory, route=1), text, "")
    # Stored without an answer: the session stays idle and the test needs no model run.
    await api.prompt(session["id"], directory, text, no_reply=True, route=1)
    # prompt_async answers before the message is stored: what the monitor looks for after a
    # failure shows up a moment later (it looks after a backoff of at least 0.1 s).
    messages = await until(
        lambda: api.messages(session["id"], directory, route=1), 5, what="the message to be stored"
    )
    assert feedback_delivered(messages, text, "")
    assert not feedback_delivered(messages, text.strip(), "")
    await api.abort(session["id"], directory, route=1)  # idle: answers true, changes nothing
    assert len(await api.messages(session["id"], directory, route=1)) == 1
