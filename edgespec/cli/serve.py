"""``edgespec serve``: the click command (same model and sampling options as ``complete``)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import config
from ..server import DEFAULT_HOST, DEFAULT_MAX_QUEUE, DEFAULT_PORT
from .options import (
    CONTEXT_SETTINGS,
    load_engine,
    make_sampling,
    model_options,
    penalty_options,
    sampling_options,
    user_errors,
)

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")



@click.command("serve", context_settings=CONTEXT_SETTINGS)
@model_options
@sampling_options
@penalty_options
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to listen on. Anything but loopback needs --allow-remote.")
@click.option("--port", "-p", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True, help="TCP port (0 = any free port; the ready line names it).")
@click.option("--allow-remote", is_flag=True,
              help="Allow listening on an address other machines can reach.")
@click.option("--api-key", envvar="EDGESPEC_API_KEY", show_envvar=True, default=None,
              help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--max-queue", type=click.IntRange(0), default=DEFAULT_MAX_QUEUE,
              show_default=True,
              help="Requests that may wait behind the running one; more get HTTP 503.")
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=config.DEFAULT_MAX_TOKENS,
              show_default=True, help="max_tokens for requests that do not set it.")
@click.option("--model-id", default=None,
              help="Model name /v1/models reports (default: the target's catalog name or "
                   "file name).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="warning",
              show_default=True, help="uvicorn's log level (info logs every request).")
@user_errors
def serve(host, port, allow_remote, api_key, max_queue, max_tokens, model_id, log_level,
          **opts) -> None:
    """Serve the models over an OpenAI-compatible HTTP API.

    Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream or
    not), GET /health, GET /metrics. One generation runs at a time; the others wait in a
    bounded queue. The sampling options, penalties and logit bias set the defaults of
    requests that leave them out.
    Stop with Ctrl-C or SIGTERM.
    """
    from ..server.run import bind_socket, check_api_key, check_host, run_server, url_of
    from ..server.schemas import Defaults

    check_host(host, allow_remote)
    api_key = check_api_key(api_key)
    defaults = Defaults(sampling=make_sampling(opts), max_tokens=max_tokens)
    model_id = model_id or served_model_id(opts)
    if allow_remote and api_key is None:
        click.echo("warning: listening beyond loopback without an API key", err=True)
    sock = bind_socket(host, port)  # fail now, not after loading the models
    try:
        with load_engine(opts) as engine:
            from ..server.app import ServerSettings, create_app

            settings = ServerSettings(model_id=model_id, api_key=api_key, max_queue=max_queue,
                                      defaults=defaults)
            app = create_app(engine, settings)

            def ready() -> None:
                click.echo(f"edgespec serve: listening on {url_of(sock)} (model {model_id}, "
                           f"drafter {engine.drafter_name}, queue {max_queue})")

            run_server(app, sock, log_level=log_level, on_ready=ready)
    finally:
        sock.close()
    click.echo("edgespec serve: stopped", err=True)



def served_model_id(opts: dict) -> str:
    """The target's catalog name, or its file name without ``.gguf``."""
    from edgespec.models.catalog import looks_like_path, resolve_pair

    target = opts["target"]
    if target is None:
        return resolve_pair(opts["pair"]).target
    return Path(target).stem if looks_like_path(target) else target
