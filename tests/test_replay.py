"""scripts/gpu/replay.py, the virtual H100: its graph rule, and that a replay commits exactly what
the model would, asks the model only for positions on the committed text, and clocks the
modelled GPU time, not the time spent answering."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.core.stats import Stats
from edgespec.runtime.drafters import LookupDrafter
from edgespec.runtime.loop import prefill, rounds

from .fakes import FakeLM, Table

ROOT = Path(__file__).resolve().parent.parent


def _load_replay():
    spec = importlib.util.spec_from_file_location("replay", ROOT / "scripts" / "gpu" / "replay.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["replay"] = module
    spec.loader.exec_module(module)
    return module


replay = _load_replay()


class _ArgmaxLM(FakeLM):
    """A fake with the real backend's ``decode_argmax``; ``stall`` seconds a call, which the
    virtual clock must not see."""

    stall = 0.0
    asked: list[tuple[int, ...]]

    def decode_argmax(self, tokens, n_logits):
        time.sleep(self.stall)
        self.asked = getattr(self, "asked", [])
        self.asked.append(tuple(self.tokens) + tuple(tokens))
        return self.decode(tokens, n_logits).argmax(axis=1)


def test_a_call_replays_a_graph_only_as_the_third_of_its_width_in_a_row():
    dev = replay.Device(lambda w: 1.0, lambda w: 10.0)
    costs = [dev.call(w) for w in (1, 1, 1, 1, 5, 1, 1, 1, 5, 5, 5)]
    # new width, capture, replay, replay; 5: new; 1: new, capture, replay; 5: new, capture, replay
    assert costs == [11, 11, 1, 1, 11, 11, 11, 1, 11, 11, 1]
    assert (dev.calls, dev.penalised, dev.captures) == (11, 7, 3)
    dev.capture_cost = 100.0
    assert [dev.call(w) for w in (2, 2, 2)] == [11, 111, 1]


def test_interpolation_between_and_past_the_measured_widths():
    table = {1: 2.0, 4: 5.0, 8: 7.0}
    assert replay.interpolate(table, 4) == 5.0
    assert replay.interpolate(table, 2) == pytest.approx(3.0)
    assert replay.interpolate(table, 12) == pytest.approx(9.0)  # the last segment's slope


def _greedy_text(table, prompt, n):
    lm = _ArgmaxLM(table, n_ctx=512)
    lm.decode(prompt[:-1], 0)
    out, last = [], prompt[-1]
    for _ in range(n):
        last = int(lm.decode_argmax([last], 1)[0])
        out.append(last)
    return out


def test_a_replay_commits_the_models_greedy_text_and_asks_only_along_it(tmp_path):
    table = Table(12, seed=3, markov=4.0)  # small vocabulary: greedy text repeats, lookup drafts
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    longer = _greedy_text(table, prompt, 70)  # (a round's last token may pass the 60th)
    want = longer[:60]
    clock = replay.Clock()
    memo = replay.Memo(tmp_path / "memo.pkl")
    real = _ArgmaxLM(table, n_ctx=512)
    target = replay.Replayed("target", real, memo, replay.target_device(), clock)

    def generate():
        target.reset()
        prefill(target, prompt)
        got, drafted, accepted = [], 0, 0
        for rnd in rounds(target, LookupDrafter(), prompt, SamplingParams(temperature=0.0),
                          make_rng(0), 8, Stats(), 60):
            got += rnd.tokens
            drafted += rnd.drafted
            accepted += rnd.accepted
            if len(got) >= 60:  # (the caller stops the loop, as the engine does)
                break
        return got[:60], drafted, accepted

    got, drafted, accepted = generate()
    assert got == want
    assert drafted > 20 and accepted < drafted  # lookup drafted, some drafts were rejected
    text = prompt + longer
    for ctx in real.asked:  # the real model only ever scored positions of the committed text
        assert list(ctx) == text[:len(ctx)]
    misses = memo.misses
    assert 0 < misses <= len(want)
    memo.save()
    again = replay.Memo(tmp_path / "memo.pkl")  # from disk: the same text, no model calls
    target.memo, real.asked = again, []
    assert generate()[0] == want
    assert again.misses == 0 and real.asked == []


def test_the_virtual_clock_counts_the_modelled_gpu_time_not_the_answering():
    clock = replay.Clock()
    real = _ArgmaxLM(Table(8, seed=1), n_ctx=128)
    real.stall = 0.02  # 20 ms a model call here: none of it is GPU time
    target = replay.Replayed("target", real, replay.Memo(Path("/nonexistent/memo.pkl")),
                             replay.Device(lambda w: 1e-3 * w, lambda w: 5e-3), clock)
    start = clock()
    target.decode([1, 2, 3], 0)  # a prefill: width 3, a new width
    target.decode_argmax([4], 1)  # width 1: new
    target.decode_argmax([5], 1)  # capture
    target.decode_argmax([6], 1)  # replay
    modelled = (3e-3 + 5e-3) + (1e-3 + 5e-3) * 2 + 1e-3
    assert clock.device == pytest.approx(modelled)
    assert modelled <= clock() - start < modelled + 5e-3  # the 60 ms of stalls are not there
    assert np.all(np.asarray(target.tokens) == [1, 2, 3, 4, 5, 6])


def test_the_lookup_ceiling_is_the_best_schedule_of_draft_lengths():
    """lookup_ceiling: with every call costing 1 whatever its width and no penalty, the best
    schedule drafts everything lookup gets right, so the ceiling is tokens over rounds; with
    nothing to copy it is plain decoding (1.0); with a switch penalty it is the dynamic
    programme's least time, checked against every schedule of a short answer by brute force."""
    import itertools

    flat = replay.Device(lambda w: 1.0, lambda w: 0.0)
    prompt = list(range(100, 120))
    # the answer copies the prompt's 20 tokens after a 2-token start, then 4 new tokens
    answer = [100, 101, *range(102, 120), 7, 8, 9, 6]
    ceiling = replay.lookup_ceiling(prompt, answer, LookupDrafter(), flat)
    # 2 plain steps (no match yet), one round of 18 right + 1, then 3 plain steps
    assert ceiling == pytest.approx(len(answer) / 6)
    assert replay.lookup_ceiling(prompt, [1, 2, 3, 4, 5], LookupDrafter(), flat) == 1.0

    graph = replay.Device(lambda w: 1.0 + 0.1 * w, lambda w: 0.6)
    answer = [100, 101, 102, 103, 104, 9, 100, 101]
    got = replay.lookup_ceiling(prompt, answer, LookupDrafter(), graph, k_max=4)

    def brute():  # every choice of k at every round: least time to finish
        offers, context, lookup = [], list(prompt), LookupDrafter()
        for i in range(len(answer)):  # (proposals as in plain steps: one growing text)
            d = lookup.propose(context, 4, None, None).tokens
            right = 0
            while right < len(d) and i + right < len(answer) and d[right] == answer[i + right]:
                right += 1
            offers.append((len(d), right))
            context.append(answer[i])
        best = float("inf")
        for ks in itertools.product(range(5), repeat=len(answer)):
            i, t, last, run = 0, 0.0, 0, 1
            for k in ks:
                if i >= len(answer):
                    break
                if k > offers[i][0]:
                    t = float("inf")
                    break
                w = k + 1
                t += 1.0 + 0.1 * w + (0.0 if (w == last and run >= 2) else 0.6)
                run, last = (run + 1 if w == last else 1), w
                i += min(k, offers[i][1]) + 1
            if i >= len(answer):
                best = min(best, t)
        return best

    plain = sum(1.1 + (0.0 if i >= 2 else 0.6) for i in range(len(answer)))
    assert got > 1.1 and got == pytest.approx(plain / brute())


def test_a_measured_device_costs_its_curve_and_its_penalty_after_a_change_of_width():
    """--machine: a bench calibration as a device: t(n) from its curve (interpolated), and
    the switch penalty on a call that is not the third of its width in a row (0 on a CPU)."""
    cpu = replay.measured_device({1: 0.05, 4: 0.17}, 0.0)
    assert [cpu.call(w) for w in (1, 1, 4, 2)] == pytest.approx([0.05, 0.05, 0.17, 0.09])
    gpu = replay.measured_device({1: 2e-3, 4: 3e-3}, 1e-3)
    assert [gpu.call(1) for _ in range(3)] == pytest.approx([3e-3, 3e-3, 2e-3])
    assert gpu.call(4) == pytest.approx(4e-3)


def test_a_call_launched_ahead_runs_while_the_host_works():
    """A round's call launched before the host works on (as the loop does on a GPU): the
    virtual clock waits only for what is left of its modelled time when the result is read."""
    clock = replay.Clock()
    real = _ArgmaxLM(Table(8, seed=1), n_ctx=128)
    target = replay.Replayed("target", real, replay.Memo(Path("/nonexistent/memo.pkl")),
                             replay.Device(lambda w: 10e-3, lambda w: 0.0), clock)
    target.decode([1, 2, 3], 0)
    for host, took in ((0.004, 0.010), (0.015, 0.015)):  # the call's 10 ms, or the host's
        start = clock()
        target.start_decode([4], 1, picks=True)
        time.sleep(host)
        assert len(target.finish_decode()) == 1
        assert took <= clock() - start < took + 3e-3
    start = clock()  # in order: the call, then the host's work
    target.decode_argmax([5], 1)
    time.sleep(0.004)
    assert 0.014 <= clock() - start < 0.014 + 3e-3
