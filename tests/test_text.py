"""Text loops: given these deltas and text parts, this decision (monitor/core/rules/text.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from monitor.core.frames import iter_sse_data
from monitor.core.rules.cycle import Cycle
from monitor.core.rules.text import MAX_UNIT, TextLoop, TextStream, text_digest
from monitor.core.texts import MAX_STREAMING_PARTS
from monitor.core.tracker import Detection, Tracker
from tests.corpus.record_text import (
    ONE_LINE,
    PARAGRAPH,
    chunk_of,
    code_block,
    different_lines,
    numbered_list,
    table,
)

CORPUS = Path(__file__).resolve().parent / "corpus"
SES = "ses_1"


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def first_loop(text: str, size: int = 7, repeats: int = 5) -> TextLoop | None:
    stream = TextStream(repeats=repeats)
    for delta in pieces(text, size):
        if (found := stream.feed(delta)) is not None:
            return found
    return None


# -- one streamed part ---------------------------------------------------------------------


def test_a_sentence_written_five_times_is_found_on_the_delta_that_completes_it():
    text = ONE_LINE * 40
    found = first_loop(text, size=12)
    assert found == TextLoop(units=1, repetitions=5, chunk=chunk_of("", ONE_LINE))


def test_a_paragraph_is_found_as_one_passage_of_its_sentences():
    found = first_loop("To start, here is the context.\n\n" + PARAGRAPH * 300, size=5)
    assert found is not None and (found.units, found.repetitions) == (4, 5)


def test_how_the_text_is_chunked_does_not_change_what_is_found():
    text = "Some intro. " + PARAGRAPH * 10
    found = {size: first_loop(text, size) for size in (1, 3, 64, len(text))}
    assert {(f.units, f.repetitions) for f in found.values() if f} == {(4, 5)}
    assert found[1].chunk == len("Some intro. ") + 5 * len(PARAGRAPH) - 1  # at the newline
    assert found[len(text)].chunk == 1  # one delta holding everything


def test_four_repetitions_are_not_enough():
    assert first_loop(ONE_LINE * 4 + "And then something else entirely.") is None


def test_the_threshold_is_a_setting():
    text = ONE_LINE * 3 + "x"
    assert first_loop(text, repeats=3) is not None and first_loop(text, repeats=4) is None


@pytest.mark.parametrize(
    "text",
    [different_lines(), code_block(), table(), numbered_list()],
    ids=["different-lines", "code-block", "table", "numbered-list"],
)
def test_legitimate_repetition_is_not_a_loop(text):
    assert first_loop(text, size=9) is None


def test_identical_lines_inside_a_code_block_are_not_a_loop():
    assert first_loop("Code:\n\n```\n" + "    pass\n" * 50 + "```\n") is None


def test_the_same_code_block_written_again_and_again_is():
    block = "Try this:\n```sh\nmake test\n```\n"
    assert first_loop(block * 6) == first_loop(block * 20) != None  # noqa: E711


def test_an_unclosed_fence_keeps_what_follows_out():
    assert first_loop("```\n" + ONE_LINE * 50) is None


def test_a_passage_longer_than_the_longest_block_is_not_found():
    # 40 different sentences repeated: longer than the 32 units looked back at.
    sentences = "".join(f"Sentence {n} is here, number {n}. " for n in range(40))
    assert first_loop(sentences * 10) is None


def test_text_without_any_boundary_is_cut_and_still_caught():
    found = first_loop("na " * 100_000, size=50)
    assert found is not None and found.chunk * 50 < 64 * 1024


def test_memory_per_part_stays_bounded_however_long_the_part():
    stream = TextStream()
    for n in range(20_000):  # 1.4 MB of all-different text, no loop
        stream.feed(f"word{n} and more " if n % 7 else f"line {n} ends here.\n")
        assert len(stream._tail) <= MAX_UNIT + 20
    assert stream.found is None and stream.chunks == 20_000


def test_after_a_loop_further_deltas_are_counted_not_judged():
    stream = TextStream()
    for delta in pieces(ONE_LINE * 10, 10):
        stream.feed(delta)
    assert stream.found is not None and stream.chunks == len(pieces(ONE_LINE * 10, 10))


# -- the same text at successive steps -----------------------------------------------------


def test_a_text_digest_sets_white_space_aside():
    a, b = text_digest("Same  answer."), text_digest("Other answer.")
    assert a != b and text_digest("Same answer.\n") == a and text_digest(" -- ") is None


# -- the tracker ---------------------------------------------------------------------------


def part(part_id, kind="text", text="", *, start=True, end=False, session=SES):
    time = {}
    if start:
        time["start"] = 1
    if end:
        time["end"] = 2
    body = {"id": part_id, "sessionID": session, "messageID": "msg_1", "type": kind}
    body |= {"text": text, "time": time} if time else {"text": text}
    return {"type": "message.part.updated", "properties": {"sessionID": session, "part": body}}


def delta(part_id, text, session=SES):
    props = {"sessionID": session, "messageID": "msg_1", "partID": part_id, "field": "text"}
    return {"type": "message.part.delta", "properties": props | {"delta": text}}


def stream_part(tracker, part_id, text, size=10, kind="text"):
    decisions = list(tracker.feed(part(part_id, kind)).decisions)
    for chunk in pieces(text, size):
        decisions += tracker.feed(delta(part_id, chunk)).decisions
    decisions += tracker.feed(part(part_id, kind, text, end=True)).decisions
    return decisions


def test_tracker_stops_a_repeated_sentence_and_says_so_without_quoting_it():
    tracker = Tracker()
    [decision] = stream_part(tracker, "prt_a", ONE_LINE * 30, size=12)
    assert decision.rule == "text_repeat" and decision.part_id == "prt_a"
    assert (Cycle(*decision.finding.shape()[:2]), decision.finding.shape()[2]) == (Cycle(1, 5), ())
    assert decision.position == chunk_of("", ONE_LINE)
    assert not decision.hold and not decision.escalated and decision.prior_interventions == 0
    assert decision.feedback.startswith("Automatic notice: ")
    assert "in your answer you wrote the same sentence 5 times in a row" in decision.feedback
    assert "configuration" not in decision.feedback
    # Every delta after the one that decided was streamed for nothing.
    assert (
        tracker.texts.chunks_after_detection == len(pieces(ONE_LINE * 30, 12)) - decision.position
    )


def test_a_text_loop_is_stopped_also_where_the_first_action_is_a_nudge():
    # The model reads a nudge at its next step; a part repeating itself until its token
    # limit does not reach one: only the abort stops it.
    [decision] = stream_part(Tracker(Detection(first_action="nudge")), "prt_a", ONE_LINE * 9)
    assert (decision.plan, decision.action) == ("stop", "stop")
    assert decision.feedback.startswith(
        "Automatic notice: your run was stopped because it was repeating"
    )


def test_tracker_names_reasoning():
    [decision] = stream_part(Tracker(), "prt_r", ONE_LINE * 9, kind="reasoning")
    assert "in your reasoning you wrote the same sentence 5 times" in decision.feedback


def test_a_part_whose_start_was_missed_is_judged_from_its_deltas():
    tracker = Tracker()
    decisions = [
        d for c in pieces(ONE_LINE * 9, 8) for d in tracker.feed(delta("prt_x", c)).decisions
    ]
    assert [d.rule for d in decisions] == ["text_repeat"]


def test_text_repeats_zero_turns_the_check_off():
    assert stream_part(Tracker(Detection(text_repeats=0)), "prt_a", ONE_LINE * 30) == []


def test_the_same_text_at_successive_steps_is_a_loop_at_the_eighth():
    tracker = Tracker()
    decisions = []
    for step in range(10):
        decisions += stream_part(tracker, f"prt_{step}", "I will look around a bit more.")
    [decision] = decisions
    assert (decision.rule, decision.part_id, Cycle(*decision.finding.shape()[:2])) == (
        "text_steps",
        "prt_7",
        Cycle(1, 8),
    )
    assert "your answer was the same at 8 successive steps" in decision.feedback


def test_a_different_text_between_steps_starts_the_count_again():
    tracker = Tracker()
    texts = ["Same."] * 7 + ["Different."] + ["Same."] * 7
    assert [d for i, t in enumerate(texts) for d in stream_part(tracker, f"p{i}", t)] == []


def test_an_idle_session_starts_its_step_count_again():
    tracker = Tracker()
    for step in range(7):
        stream_part(tracker, f"p{step}", "Same.")
    tracker.feed({"type": "session.idle", "properties": {"sessionID": SES}})
    assert stream_part(tracker, "p7", "Same.") == []


def test_user_prompts_are_not_steps():
    tracker = Tracker()
    prompt = part("prt_u", text="Same.", start=False)
    assert all(tracker.feed(prompt).decisions == () for _ in range(20))


def test_escalation_counts_text_loops_with_tool_loops():
    tracker = Tracker(Detection(max_interventions=1))
    first = stream_part(tracker, "prt_1", ONE_LINE * 9)
    second = stream_part(tracker, "prt_2", ONE_LINE * 9)
    assert [(d.prior_interventions, d.hold, d.escalated) for d in first + second] == [
        (0, False, False),
        (1, True, True),
    ]
    assert "on hold until a person replies" in second[0].feedback


def test_streaming_parts_are_bounded():
    tracker = Tracker()
    for n in range(MAX_STREAMING_PARTS + 100):
        tracker.feed(part(f"prt_{n}"))
        tracker.feed(delta(f"prt_{n}", "Some text that goes on"))
    assert len(tracker.texts.parts) == MAX_STREAMING_PARTS
    assert (
        "prt_0" not in tracker.texts.parts
        and f"prt_{MAX_STREAMING_PARTS + 99}" in tracker.texts.parts
    )


def test_a_malformed_delta_is_counted():
    tracker = Tracker()
    fed = tracker.feed(
        {"type": "message.part.delta", "properties": {"sessionID": SES, "delta": "x"}}
    )
    assert fed.malformed == "message.part.delta: partID is not a non-empty string"


# -- the labelled traces of the real server --------------------------------------------------


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.text-*.sse")), ids=lambda p: p.name)
def test_corpus_trace_gets_its_label(path):
    label = path.open(encoding="utf-8").readline().strip()
    tracker = Tracker()
    with path.open(encoding="utf-8") as lines:
        found = [
            d.position for data in iter_sse_data(lines) for d in tracker.feed_data(data).decisions
        ]
    match = re.fullmatch(r": expect (legit|loop at (\d+))", label)
    assert match is not None
    assert found == ([] if match[1] == "legit" else [int(match[2])])
    assert (".text-loop." in path.name) == (match[1] != "legit")


def test_the_recorded_stream_types_reasoning_and_text_parts():
    tracker = Tracker()
    recording = Path(__file__).resolve().parent / "recordings" / "text-reasoning-stream.event.sse"
    with recording.open(encoding="utf-8") as lines:
        [decision] = [d for data in iter_sse_data(lines) for d in tracker.feed_data(data).decisions]
    # The reasoning says "Hmm, think." 4 times: allowed; the answer "The cat sat." 6 times.
    assert decision.part_id == "prt_22c3312970012bDm5lsz20J1Jv"
    assert "in your answer you wrote the same sentence 5 times" in decision.feedback
    assert decision.position == 10  # "The cat sat. " x 5, then the next character, in 7s
    assert tracker.texts.chunks_after_detection == 2
