"""Helpers for the server tests: uvicorn in a background thread, fake engines, a slow fake model."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from edgespec.runtime.engine import Engine
from edgespec.server.app import ServerSettings, create_app
from edgespec.server.run import bind_socket, make_server, url_of

from .fakes import FakeLM, Table

MODEL_ID = "test-model"


@dataclass
class Served:
    """A running server: its base URL (``.../v1`` for the openai client) and its app."""

    url: str
    app: Any

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    @property
    def worker(self):
        return self.app.state.worker


@contextmanager
def running_server(engine: Engine, **settings: Any) -> Iterator[Served]:
    """Serve ``engine`` with uvicorn on a free loopback port in a background thread."""
    settings.setdefault("model_id", MODEL_ID)
    app = create_app(engine, ServerSettings(**settings))
    sock = bind_socket("127.0.0.1", 0)
    server = make_server(app, log_level="error")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield Served(url_of(sock), app)
    finally:
        app.state.worker.cancel_all()
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"


class SlowLM(FakeLM):
    """A fake model whose ``decode`` takes ``delay`` seconds and waits while ``gate`` is clear
    (a test holds the worker busy with it)."""

    def __init__(self, *args: Any, delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def decode(self, tokens, n_logits):
        if not self.gate.wait(timeout=30):
            raise TimeoutError("gate never opened")
        if self.delay:
            time.sleep(self.delay)
        return super().decode(tokens, n_logits)


def fake_engine(*, delay: float = 0.0, n_ctx: int = 256, eog: tuple[int, ...] = ()) -> Engine:
    """An engine over a fake target drafting for itself (every draft accepted). Its text is
    printable ASCII and never ends early unless ``eog`` names end tokens."""
    table = Table(40, seed=3)
    target = SlowLM(table, n_ctx=n_ctx, delay=delay, eog=eog)
    draft = FakeLM(table, n_ctx=n_ctx, eog=eog)
    return Engine(target, draft, drafter="model", draft_length=4)
