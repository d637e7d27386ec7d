"""``edgespec chat`` end to end on real llama.cpp (the tiny SmolLM2-135M drafting for itself):
a pilot test through the app, and the real command in a real terminal (tmux).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgespec.core.sampling import SamplingParams
from tui.app import ChatApp, ChatSettings

from .test_tui_helpers import (
    drive,
    panel_text,
    type_and_send,
    until_answered,
    until_ready,
)

pytestmark = pytest.mark.real

GREEDY = SamplingParams(temperature=0)
QUESTION = "What is a linked list?"


@pytest.fixture(scope="module")
def tiny_engine_1thread():
    """The tiny pair on one thread: llama.cpp's threads spin-wait, and on a busy 2-core machine
    two of them can be 100x slower than one (this test times nothing against a reference).
    Loaded as ``edgespec chat`` loads it: drafter auto (its draft model, its measured costs)."""
    from edgespec.runtime.engine import Engine

    with Engine.load(pair="tiny", drafter="auto", n_ctx=2048, n_threads=1, progress=False) as engine:
        yield engine


def test_chat_on_the_real_tiny_model(tiny_engine_1thread):
    tiny_engine = tiny_engine_1thread
    app = ChatApp(lambda: tiny_engine,
                  ChatSettings(drafter="model", max_tokens=24))

    async def scenario(pilot):
        await until_ready(pilot, timeout=120)
        assert "(measured in each turn)" in panel_text(app)
        await type_and_send(pilot, QUESTION)
        await until_answered(pilot, 2, timeout=180)
        stats = app.last_view.stats
        answer = app.conversation.last_answer()
        # exact: greedy speculative text is the target's own greedy text
        plain = tiny_engine.complete([{"role": "user", "content": QUESTION}], drafter="none",
                                     max_tokens=24, sampling=GREEDY)
        assert answer == plain.text and answer.strip()
        # the panel shows the engine's stats: the model drafting for itself passes every draft
        assert stats.drafted > 0 and stats.accepted == stats.drafted
        text = panel_text(app)
        speedup = stats.speedup  # every round drafts: target-only derived through the curve
        assert speedup.basis == "curve" and speedup.samples == stats.rounds
        for value in ("100%", f"{stats.mean_accepted:.2f}", f"{stats.tokens_per_second:.1f} tok/s",
                      f"{speedup.target_only_tokens_per_second:.1f} tok/s", f"{speedup.ratio:.2f}×",
                      f"(derived from curve, {stats.rounds} calls)", "turn 1 · model k=4"):
            assert value in text, value
        # plain decoding: its own baseline, exactly 1
        await pilot.press("ctrl+d", "ctrl+d")  # model -> lookup -> none
        assert app.drafter == "none"
        await type_and_send(pilot, "Thanks. Now in one sentence?")
        await until_answered(pilot, 4, timeout=180)
        second = app.last_view.stats
        assert second.drafted == 0 and second.generated >= 8
        assert second.speedup.ratio == 1.0
        assert f"(measured in turn, {second.rounds} steps)" in panel_text(app)
        assert "1.00×" in panel_text(app)

    drive(app, scenario, size=(100, 30))


# ---- a real terminal ------------------------------------------------------------------------


class Tmux:
    """A private tmux server (its own socket) running one session."""

    def __init__(self, name: str) -> None:
        self.socket = f"edgespec-test-{os.getpid()}-{name}"
        self.name = name

    def __call__(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                                capture_output=True, text=True, check=check, timeout=30)
        return result.stdout

    def start(self, command: str, width: int, height: int) -> None:
        self("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), command)

    def capture(self) -> str:
        return self("capture-pane", "-p", "-t", self.name)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", self.name],
                              capture_output=True).returncode == 0

    def wait_for(self, predicate, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.capture()
            if predicate(screen):
                return screen
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def edgespec_command() -> str:
    script = Path(sys.executable).with_name("edgespec")
    return str(script) if script.exists() else f"{sys.executable} -m edgespec"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_edgespec_chat_in_a_real_terminal(tmp_path):
    tmux = Tmux("chat")
    # (Textual draws on stderr: no redirection.) "sleep" keeps the pane to read the exit status.
    command = (f"cd {tmp_path} && {edgespec_command()} chat --pair tiny --drafter hybrid --threads 1 "
               f"--max-tokens 32; echo EXIT=$?; sleep 5")
    try:
        tmux.start(command, 100, 30)
        tmux.wait_for(lambda s: "Message (Enter sends" in s, 120, "the models to load")
        tmux("send-keys", "-t", tmux.name, QUESTION, "Enter")
        # the answer streams in, and the panel fills with the engine's numbers
        screen = tmux.wait_for(lambda s: "tok/s · " in s and "turn 1 · hybrid k=4 · " in s
                               and "streaming" not in s, 180, "the answer and its stats")
        assert QUESTION in screen
        assert "(derived from curve," in screen  # hybrid drafts every round
        panel = {line.split("│")[-2].strip() for line in screen.splitlines() if line.count("│") >= 2}
        labels = {"speed turn", "target-only", "speedup", "acceptance", "accepted/round", "drafted",
                  "accepted"}
        for label in labels:
            assert any(row.startswith(label) and row[len(label):].strip() not in ("", "–", "n/a")
                       for row in panel), (label, screen)
        assert "Traceback" not in screen
        tmux("send-keys", "-t", tmux.name, "C-q")
        screen = tmux.wait_for(lambda s: "EXIT=" in s, 30, "the app to quit")
        assert "EXIT=0" in screen and "Traceback" not in screen
    finally:
        tmux.kill()
