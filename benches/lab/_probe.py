"""Whether this machine can host a lab: root, ``ip``, ``tc`` and the right to make a namespace
and shape a veth in it. Checked once by really doing it, since a container can be root and
still lack the capability; the probe holds an owner lock like any lab, so a parallel
``cleanup()`` leaves it alone."""

from __future__ import annotations

import functools
import os
import shutil
from typing import Optional

from ._cleanup import hold_lock, lock_path
from ._ip import LabError, new_name, run


@functools.lru_cache(maxsize=1)
def unavailable() -> Optional[str]:
    """Why no lab can be built here, or None when one can."""
    if os.geteuid() != 0:
        return "the lab needs root to create network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the lab needs `{tool}` (iproute2), not found on PATH"
    name = new_name()
    try:
        lock = hold_lock(name)
    except OSError as e:
        return f"cannot write the lab's lock file: {e}"
    probe = f"{name}-probe"
    try:
        run("ip", "netns", "add", probe)
        run("ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        run(
            *"tc -n".split(),
            probe,
            *"qdisc add dev p0 root tbf rate 1gbit".split(),
            *"burst 512kb latency 100ms".split(),
        )
    except LabError as e:
        return f"cannot make a shaped veth pair in a network namespace: {e}"
    finally:
        run("ip", "netns", "delete", probe, check=False)
        lock_path(name).unlink(missing_ok=True)
        lock.close()
    return None
