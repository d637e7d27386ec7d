"""The ``edgespec`` command (and ``python -m edgespec``).

A thin entry point: it imports the CLI itself, so that Ctrl-C during the second or so that the
imports take ends the program quietly (``[interrupted]``, exit code 130) like Ctrl-C at any later
point, instead of printing a traceback.
"""

from __future__ import annotations

import os
import signal


def _quit_now(signum: int, frame: object) -> None:
    """Ctrl-C while the imports run: nothing is loaded or written yet, so leave at once.

    (A ``KeyboardInterrupt`` raised here could land inside a callback that the import
    machinery runs, such as its module-lock weakref callback, where Python prints "Exception
    ignored" and drops it: the program would then go on as if Ctrl-C had not been pressed.)
    """
    os.write(2, b"\n[interrupted]\n")
    os._exit(130)


def main() -> None:
    """Run the ``edgespec`` command line."""
    previous = signal.signal(signal.SIGINT, _quit_now)
    try:
        from edgespec.cli.main import main as cli_main
    finally:
        signal.signal(signal.SIGINT, previous)
    cli_main()


if __name__ == "__main__":
    main()
