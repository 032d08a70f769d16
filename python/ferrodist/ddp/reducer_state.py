"""Small records the Reducer keeps beside its buckets: runtime stamps and error texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass
class RuntimeTimes:
    """Nanosecond stamps of the last iteration, read by the Logger.

    Wall-clock ``time.time_ns``, as torch logs them (``*_time_start``/``*_time_end`` keys).

    ``backward_compute_end - comm_start`` is how long communication ran while backward was
    still computing: the overlap DDP exists for.
    """

    forward_start: int = 0
    backward_compute_start: int = 0
    backward_compute_end: int = 0
    comm_start: int = 0
    comm_end: int = 0


_BASE = (
    "Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing "
    "loss. "
)
_OUTPUTS = "making sure all `forward` function outputs participate in calculating loss. "
_STATIC = (
    "Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your training graph has changed in this iteration, e.g., one "
    "parameter is used in first iteration, but then got unused in the second iteration. this "
    "is not compatible with static_graph set to True."
)


def unfinished_reduction_message(
    static_graph: bool,
    find_unused: bool,
    rank: int,
    missing: Sequence[int],
    names: Mapping[int, str],
) -> str:
    """torch's "prior reduction not finished" text, naming the parameters that got no grad."""
    if static_graph:
        text = _STATIC
    elif not find_unused:
        text = (
            _BASE + "You can enable unused parameter detection by passing the keyword argument "
            "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, "
            "and by \n" + _OUTPUTS
        )
    else:
        text = (
            _BASE + "Since `find_unused_parameters=True` is enabled, this likely  means that "
            "not all `forward` outputs participate in computing loss. You can fix this by "
            + _OUTPUTS
        )
    listed = ", ".join(str(i) for i in missing)
    named = ", ".join(names.get(i, f"<param {i}>") for i in missing)
    return (
        f"{text}\nParameter indices which did not receive grad for rank {rank}: {listed}"
        f"\nParameters which did not receive grad for rank {rank}: {named}"
    )
