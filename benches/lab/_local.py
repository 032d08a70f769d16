"""What a rank inside a lab host reads about its own link, without calling ``ip``.

``ip netns exec`` mounts the namespace's own sysfs, so ``/sys/class/net/IF/statistics`` there
counts the host's interface: a rank can take its bytes on the wire around one step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def local_bytes(ifname: Optional[str] = None) -> tuple[int, int]:
    """(tx bytes, rx bytes) of this host's lab interface (``LAB_IFNAME`` by default)."""
    name = ifname or os.environ["LAB_IFNAME"]
    base = Path("/sys/class/net") / name / "statistics"
    return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())


def local_rate_bps() -> float:
    """The host's shaped link rate in bits/s from ``LAB_RATE_BPS`` (0.0: unshaped)."""
    return float(os.environ.get("LAB_RATE_BPS", "0"))
