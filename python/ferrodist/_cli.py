"""The ``ferrodist-store`` console script: the standalone TCPStore server.

The same Rust server as the ``ferrodist-store`` cargo binary (one implementation, two ways to
install it). Run ``ferrodist-store --help`` for the options.
"""

from __future__ import annotations

import signal
import sys
from typing import Optional

from ferrodist import _native


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the server until SIGTERM or SIGINT; returns the exit status."""
    args = list(sys.argv if argv is None else argv)
    # The Rust side handles SIGINT and SIGTERM itself (graceful drain); Python's own SIGINT
    # handler would otherwise turn the same signal into a KeyboardInterrupt on return.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _native.store_server_main(args)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
