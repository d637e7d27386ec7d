"""The ``edgespec`` command (and ``python -m edgespec``).

A thin entry point: it imports the CLI itself, so that Ctrl-C during the second or so that the
imports take ends the program quietly (``[interrupted]``, exit code 130) like Ctrl-C at any later
point, instead of printing a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``edgespec`` command line."""
    try:
        from edgespec.cli.main import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("\n[interrupted]\n")
        raise SystemExit(130) from None
    cli_main()


if __name__ == "__main__":
    main()
