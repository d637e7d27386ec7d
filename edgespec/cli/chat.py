"""``edgespec chat``: the click command (same model and sampling options as ``complete``)."""

from __future__ import annotations

import threading

import click

from .. import config
from .options import (
    CONTEXT_SETTINGS,
    constraint_options,
    load_engine,
    make_constraint,
    make_sampling,
    model_options,
    penalty_options,
    sampling_options,
    user_errors,
)


@click.command("chat", context_settings=CONTEXT_SETTINGS)
@model_options
@sampling_options
@penalty_options
@constraint_options
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=config.DEFAULT_MAX_TOKENS,
              show_default=True, help="Longest answer per turn, in tokens.")
@click.option("--system", default=None, help="System message for the conversation.")
@user_errors
def chat(max_tokens, system, **opts) -> None:
    """Chat in the terminal and watch, live, what speculation buys: each turn's speedup over
    target-only decoding, both measured in that turn.

    --schema, --json-object or --grammar constrain every answer.

    Keys: ctrl+q quit, escape stop the answer, ctrl+d drafter, ctrl+k/ctrl+j draft length,
    ctrl+t temperature, ctrl+o colours, ctrl+l clear, ctrl+y copy, ctrl+s save, f1 help.
    """
    from tui.app import ChatApp, ChatSettings

    from ..runtime.rpc import on_fatal

    sampling = make_sampling(opts)  # bad values fail here, before the screen opens
    constraint = make_constraint(opts)  # every answer matches it
    settings = ChatSettings(drafter=opts["drafter"], draft_length=opts["draft_length"],
                            sampling=sampling, max_tokens=max_tokens, system=system,
                            constraint=constraint)
    # Load the draft model whenever there is one, so the drafter can be switched in the
    # app; a target without --draft gets one picked for it, or lookup and none only (the app
    # says which).
    load_opts = dict(opts, drafter="auto")  # loads the draft if there is one, measures costs

    def factory(report):
        missing = models_to_fetch(load_opts)
        report(f"Downloading {', '.join(missing)} (first use)…" if missing else "Loading models…")
        return load_engine(load_opts, progress=False)  # a progress bar would garble the screen

    app = ChatApp(factory, settings)
    lost, restored = threading.Event(), threading.Event()

    def give_terminal_back(message: str) -> None:
        # A worker fault ends the process from a generating thread: the app closes first, so
        # the terminal leaves full-screen mode before the error line.
        lost.set()
        app.call_from_thread(app.exit, None, 1)
        restored.wait(5)

    forget = on_fatal(give_terminal_back)
    try:
        app.run()
    finally:
        if lost.is_set():
            restored.set()
            threading.Event().wait()  # the faulting thread ends the process; the models stay
        forget()
        app.close_engine()



def models_to_fetch(opts: dict) -> list[str]:
    """Catalog and hub models the load will have to download (name and size), best effort."""
    from edgespec.errors import EdgespecError
    from edgespec.models.catalog import HubEntry, hub_ref_of, load_catalog, looks_like_path
    from edgespec.models.download import verified_path
    from edgespec.runtime import sources

    try:
        catalog = load_catalog()
        target, draft = opts["target"], opts["draft"]
        if target is None:
            pair = catalog.pair(opts["pair"])
            target, draft = pair.target, draft if draft is not None else pair.draft
        uses_draft = sources.spec(opts["drafter"]).uses_draft_model
        names = [target] + ([draft] if draft is not None and uses_draft else [])
        missing = []
        for name in names:
            ref = hub_ref_of(name)
            entry = catalog.models.get(name)
            if ref is not None or isinstance(entry, HubEntry):
                from edgespec.models import hub

                if hub.is_cached(ref or entry.ref) is None:
                    missing.append(f"{name} (from the hub)")
                continue
            if looks_like_path(name) or entry is None:
                continue
            if verified_path(entry) is None:
                missing.append(f"{name} ({entry.size / 1e9:.1f} GB)")
        return missing
    except (EdgespecError, OSError):
        return []
