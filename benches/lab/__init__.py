"""A multi-host lab on one machine: hosts as network namespaces on a shaped bridge.

Every speed figure taken over loopback hides the cost of moving tensors; jobs across hosts are
bound by the link. The lab gives benches and tests hosts that reach each other only through a
link shaped to a rate (``tc`` TBF on both ends of each host's veth: 1 Gbit/s by default,
10 Gbit/s or unshaped as options), launches ranks in them with the environment torch's
``env://`` rendezvous and gloo need (``MASTER_ADDR`` = host 0's lab address,
``GLOO_SOCKET_IFNAME`` = the host's interface), reads per-host byte counters from the
interfaces, and removes every namespace and process it made on exit, on failure and on
SIGINT/SIGTERM. ``cleanup()`` removes what a killed run left behind.

It needs root, ``ip`` and ``tc``; ``unavailable()`` says why a machine cannot host one, so
tests skip with that reason and benches print it.

    from benches.lab import Lab
    with Lab(hosts=2, rate="1gbit") as lab:
        results = lab.launch([sys.executable, "train.py"], ranks_per_host=1, timeout=120)

CLI: ``python -m benches.lab run|cleanup|list`` (see ``__main__``).
"""

from __future__ import annotations

from ._bench import lab_main, run_workers
from ._cleanup import cleanup, leftover_labs
from ._ip import PREFIX, LabError, lab_namespaces
from ._lab import Lab, parse_rate
from ._launch import RankResult
from ._local import local_bytes
from ._probe import unavailable

__all__ = [
    "PREFIX",
    "Lab",
    "LabError",
    "RankResult",
    "cleanup",
    "lab_main",
    "lab_namespaces",
    "leftover_labs",
    "local_bytes",
    "parse_rate",
    "run_workers",
    "unavailable",
]
