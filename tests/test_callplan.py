"""The call plan (edgespec/runtime/callplan.py) without llama.cpp: how a decode's tokens are cut
into llama_decode calls, which rows each call reads, and where the pads go."""

from __future__ import annotations

import itertools

import pytest

from edgespec.runtime.callplan import Call, one_call, plan, read_step


def spans(calls: list[Call]) -> list[tuple[int, int]]:
    return [(c.start, c.stop) for c in calls]


def test_a_prefill_goes_in_calls_of_the_batch_none_of_them_read():
    calls = plan(10, 0, batch=4)
    assert spans(calls) == [(0, 4), (4, 8), (8, 10)]
    assert [c.read_from for c in calls] == [4, 4, 2]
    assert not any(c.reads for c in calls)
    assert [c.n_outputs for c in calls] == [0, 0, 0]
    assert all(c.pads == 0 and c.width == c.size for c in calls)


def test_the_rows_read_come_in_pieces_after_the_prefill():
    calls = plan(10, 7, batch=512, piece=3)
    assert spans(calls) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [c.reads for c in calls] == [False, True, True, True]
    assert [c.first_row for c in calls[1:]] == [0, 3, 6]
    assert [c.n_read for c in calls[1:]] == [3, 3, 1]
    assert [c.n_outputs for c in calls[1:]] == [3, 3, 1]
    assert all(c.read_from == 0 and c.first_output == 0 for c in calls[1:])


def test_a_prefill_longer_than_a_batch_never_shares_a_call_with_rows_read():
    # (the batch's last prefill call stops where the reads begin, however short that makes it)
    calls = plan(11, 2, batch=4, piece=3)
    assert spans(calls) == [(0, 4), (4, 8), (8, 9), (9, 11)]
    assert [c.reads for c in calls] == [False, False, False, True]


def test_without_pieces_the_rows_read_go_in_one_call_of_up_to_the_batch():
    assert spans(plan(6, 6, batch=512)) == [(0, 6)]
    assert spans(plan(10, 10, batch=4)) == [(0, 4), (4, 8), (8, 10)]
    assert [c.first_row for c in plan(10, 10, batch=4)] == [0, 4, 8]


def test_the_backend_sampler_takes_at_most_most_rows_a_call():
    calls = plan(100, 100, batch=512, most_rows=72)
    assert spans(calls) == [(0, 72), (72, 100)]
    assert [c.first_row for c in calls] == [0, 72]
    assert spans(plan(100, 100, batch=50, most_rows=72)) == [(0, 50), (50, 100)]
    # pieces and a fixed width take their own step
    assert spans(plan(5, 5, batch=512, piece=3, most_rows=72)) == [(0, 3), (3, 5)]
    assert spans(plan(5, 5, batch=512, width=4, most_rows=72)) == [(0, 4), (4, 5)]


def test_a_piece_is_never_wider_than_the_batch():
    assert spans(plan(5, 5, batch=2, piece=3)) == [(0, 2), (2, 4), (4, 5)]


def test_at_a_fixed_width_each_call_that_reads_is_padded_to_it():
    calls = plan(12, 10, batch=16, width=4)
    assert spans(calls) == [(0, 2), (2, 6), (6, 10), (10, 12)]
    assert [c.pads for c in calls] == [0, 0, 0, 2]  # the prefill is never padded
    assert [c.width for c in calls] == [2, 4, 4, 4]
    last = calls[-1]
    assert last.n_read == 2 and last.n_outputs == 4  # the pads are outputs too
    assert last.first_output == 0 and last.first_row == 8


def test_one_token_at_a_fixed_width_is_a_full_width_call():
    [call] = plan(1, 1, batch=512, width=8)
    assert (call.size, call.pads, call.width, call.n_read, call.n_outputs) == (1, 7, 8, 1, 8)


def test_unread_rows_are_no_outputs_and_the_calls_are_cut_as_if_they_were_read():
    calls = plan(8, 6, batch=512, piece=3, unread={1, 3, 4, 9, -1})
    assert spans(calls) == spans(plan(8, 6, batch=512, piece=3))
    prefill, first, second = calls
    assert prefill.unread == ()
    assert first.unread == (1,) and second.unread == (0, 1)  # rows 3 and 4 are the second's 0, 1
    assert first.n_read == 3 and first.n_outputs == 2
    assert second.n_read == 3 and second.n_outputs == 1
    assert first.output_rows() == [0, 2] and second.output_rows() == [5]


def test_a_call_whose_every_row_is_unread_has_no_outputs():
    [call] = plan(2, 2, batch=512, unread=[0, 1])
    assert call.reads and call.n_outputs == 0 and call.output_rows() == []


def test_the_last_call_gives_the_last_rows():
    for n, k, step in itertools.product(range(1, 12), range(1, 12), range(1, 5)):
        if k > n:
            continue
        calls = plan(n, k, batch=step + 1, piece=step)
        last = calls[-1]
        assert last.stop == n and last.reads
        assert last.first_row + last.n_read == k


@pytest.mark.parametrize("width, piece, most_rows", [(0, 0, None), (0, 3, None), (0, 7, None),
                                                     (4, 0, None), (8, 0, 72), (0, 0, 5)])
def test_a_plan_feeds_every_token_once_and_gives_every_row_once(width, piece, most_rows):
    batch = 6 if width <= 6 else 16
    for n, k in itertools.product(range(0, 20), range(0, 20)):
        if k > n:
            continue
        calls = plan(n, k, batch=batch, width=width, piece=piece, most_rows=most_rows)
        assert [c.start for c in calls] == [0, *(c.stop for c in calls)][:len(calls)]
        assert (calls[-1].stop if calls else 0) == n
        rows = [c.first_row + j for c in calls if c.reads for j in range(c.n_read)]
        assert rows == list(range(k))
        for c in calls:
            assert c.size > 0 and c.size <= max(batch, width)
            assert c.reads == (c.start >= n - k)  # no call holds both prefill and read tokens
            assert c.pads == (width - c.size if width and c.reads else 0)


def test_the_step_where_rows_are_read():
    assert read_step(512) == 512
    assert read_step(512, most_rows=72) == 72
    assert read_step(512, piece=3, most_rows=72) == 3
    assert read_step(512, width=8, piece=3, most_rows=72) == 8
    assert read_step(2, piece=3) == 2
    assert read_step(50, most_rows=72) == 50


def test_a_plan_refuses_more_rows_than_tokens():
    assert plan(0, 0, batch=4) == []
    with pytest.raises(ValueError):
        plan(3, 4, batch=4)
    with pytest.raises(ValueError):
        plan(3, -1, batch=4)


def test_one_call_reads_the_last_rows_or_at_a_fixed_width_all_of_them_padded():
    call = one_call(5, 2)
    assert (call.start, call.stop, call.read_from, call.pads) == (0, 5, 3, 0)
    assert (call.n_read, call.n_outputs, call.first_output) == (2, 2, 0)
    padded = one_call(3, 3, width=8)
    assert (padded.read_from, padded.pads, padded.width, padded.n_outputs) == (0, 5, 8, 8)
    assert one_call(8, 8, width=8).pads == 0
    for n, k, width in ((5, 2, 8), (9, 9, 8), (3, 0, 0), (3, 4, 0)):
        with pytest.raises(ValueError):
            one_call(n, k, width=width)
