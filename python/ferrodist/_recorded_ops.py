"""Collective and point-to-point functions that record themselves in the flight recorder.

Each wrapper has its torch function's exact signature (``__signature__`` and ``__wrapped__``,
read from the installed torch, so torch 2.4's and 2.15's parameter lists are both right) and
finds its arguments by position or keyword with indexes computed once here, not by
``inspect.Signature.bind`` per call. With recording off (``FERRODIST_FLIGHT_RECORDER=0``) a
wrapper is one check and the torch call.

What is recorded as an op's shapes is what every member of the group passes alike (the input of
an all-gather, the tensor of a gather or scatter), so that a shape differing between ranks means
a real mismatch; all-to-all records no shapes, since its splits may differ by rank.

A collective (or an ``isend`` / ``irecv``) on CPU tensors is launched first and recorded after,
while the backend runs it: recorded first, every launch waited for the recorder's few
microseconds, and on a small machine any work just before a gloo op costs more than itself (the
control rows of ``benches/flight_overhead.py``), on a pipeline's exchange several times over.
The order changes nothing a diagnosis reads: the op is recorded, issued and started, before
anything waits for it, and a launch that raises is recorded failed.
An op that may block in its very call is still recorded before it, so that a hang there is seen:
one without an asynchronous form (the object collectives), one without tensors (a barrier) and
one on a device (NCCL sets up a group's communicator in its first op's launch, waiting for every
peer; a synchronous one is made as the asynchronous call and its wait, marked completed once the
device has run it).
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import FrameType
from typing import Any, Callable, Optional

import torch
import torch.distributed as _tdist

from ferrodist.debug import _recorder
from ferrodist.debug._describe import describe_group

__all__ = ["collective", "p2p"]


class _Arg:
    """Reads one parameter of a call by position or keyword, else its default."""

    __slots__ = ("default", "index", "name")

    def __init__(self, signature: inspect.Signature, name: str) -> None:
        names = list(signature.parameters)
        self.name = name
        self.index = names.index(name) if name in names else -1
        default = signature.parameters[name].default if name in names else None
        self.default = None if default is inspect.Parameter.empty else default

    @property
    def position(self) -> int:
        """Its index among the positional parameters, or one no call reaches when it has none
        (so that ``args[at] if at < len(args) else kwargs.get(...)`` reads it either way)."""
        return self.index if self.index >= 0 else sys.maxsize

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if 0 <= self.index < len(args):
            return args[self.index]
        return kwargs.get(self.name, self.default)


_Tensor = torch.Tensor


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def collective(
    name: str,
    fn: Callable[..., Any],
    tensors: Optional[str] = None,
    reduce_op: Optional[str] = None,
    dtypes_only: bool = False,
    internal: bool = False,
) -> Callable[..., Any]:
    """``fn`` recorded as ``name``; ``tensors`` and ``reduce_op`` name its parameters.
    ``internal``: only ferrodist's own code calls it, from a scope's frame or an autograd hook
    (``_call_site.internal_call_site``)."""
    sig = inspect.signature(fn)
    group_arg = _Arg(sig, "group")
    async_arg = _Arg(sig, "async_op")
    tensor_arg = _Arg(sig, tensors) if tensors else None
    op_arg = _Arg(sig, reduce_op) if reduce_op else None
    state = _recorder._State
    begin = _recorder.begin
    with_shapes = not dtypes_only
    # Each argument read inline (``args[at] if at < len(args) else kwargs.get(...)``) rather
    # than through ``_Arg.__call__``: every op takes this path, and a Python call is a few per
    # cent of what recording one costs (``benches/flight_overhead.py``, its stub rows).
    group_at, group_default = group_arg.position, group_arg.default
    async_at, async_default = async_arg.position, async_arg.default
    tensor_name = tensor_arg.name if tensor_arg is not None else ""
    tensor_at = tensor_arg.position if tensor_arg is not None else -1
    tensor_default = tensor_arg.default if tensor_arg is not None else None
    op_name = op_arg.name if op_arg is not None else ""
    op_at = op_arg.position if op_arg is not None else -1
    op_default = op_arg.default if op_arg is not None else None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = state.recorder if state.decided else _recorder.recorder()
        if rec is None:
            return fn(*args, **kwargs)
        caller = sys._getframe(1)
        count = len(args)
        if tensor_at < 0:
            described: list[torch.Tensor] = []
        else:
            value = (
                args[tensor_at] if tensor_at < count else kwargs.get(tensor_name, tensor_default)
            )
            described = [value] if type(value) is _Tensor else _tensors_of(value)
        is_async = bool(
            args[async_at] if async_at < count else kwargs.get("async_op", async_default)
        )
        on_cpu = bool(described) and described[0].is_cpu
        if async_arg.index < 0 or (not on_cpu and (is_async or not _on_device(described))):
            # may block in its very call (see the module doc): recorded first, called as it is
            ident = _begin(described, args, kwargs, caller, False)
            return _recorder.finish_call(ident, is_async, fn, *args, **kwargs)
        # Launched asynchronously (a synchronous call as torch makes it: the asynchronous call,
        # then its wait); on CPU tensors recorded after the launch, on a device before it.
        ident = None if on_cpu else _begin(described, args, kwargs, caller, True)
        if is_async:
            launch_args, launch_kwargs = args, kwargs
        elif async_at < count:
            launch_args, launch_kwargs = (*args[:async_at], True, *args[async_at + 1 :]), kwargs
        else:
            launch_args, launch_kwargs = args, {**kwargs, "async_op": True}
        try:
            work = fn(*launch_args, **launch_kwargs)
        except BaseException as e:
            _recorder.fail(_begin(described, args, kwargs, caller, True) if on_cpu else ident, e)
            raise
        if on_cpu:
            ident = _begin(described, args, kwargs, caller, True)
        if is_async:
            _recorder.hold_until_finished(ident, work)
            return work
        _recorder.wait_launched(ident, work, not on_cpu)
        return None

    def _begin(
        described: list[torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        caller: FrameType,
        started: bool,
    ) -> Optional[int]:
        count = len(args)
        group = args[group_at] if group_at < count else kwargs.get("group", group_default)
        if op_at < 0:
            op = None
        else:
            op = args[op_at] if op_at < count else kwargs.get(op_name, op_default)
        return begin(
            name, describe_group(group), described, op, with_shapes, started, caller, internal
        )

    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    if "." not in name:  # a public op: torch's name, even over ferrodist's own ``_all_reduce``
        wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def _on_device(tensors: list[torch.Tensor]) -> bool:
    """Whether a synchronous call on ``tensors`` returns before its op has run: a CUDA op is only
    enqueued on the stream when the call returns (outside CUDA graph capture, where the op is not
    run at all until the graph is replayed)."""
    return bool(tensors) and tensors[0].is_cuda and not torch.cuda.is_current_stream_capturing()


class _P2P:
    """A send or receive recorded on its pair's channel (see ``debug._describe``); a receive
    from any source on its rank's own channel until its sender is known.

    An object rather than a function for one reason: torch's ``P2POp`` accepts only an op equal
    to its own ``isend`` or ``irecv``, so ``P2POp(ferrodist.isend, ...)`` must keep working;
    this compares (and hashes) equal to the torch function it wraps. torch's
    ``batch_isend_irecv`` then calls it with the peer as ``group_src`` whatever its direction
    (it tells a send by identity), so a send also takes the peer under that name.
    """

    def __init__(self, name: str, fn: Callable[..., Any], sending: bool, is_async: bool) -> None:
        sig = inspect.signature(fn)
        self._fn = fn
        self._name = name
        self._sending = sending
        self._async = is_async
        self._group = _Arg(sig, "group")
        self._peer = _Arg(sig, "dst" if sending else "src")
        self._group_peer = _Arg(sig, "group_dst" if sending else "group_src")
        self._payload = _Arg(sig, next(iter(sig.parameters)))
        self._objects = name.endswith("_object_list")
        functools.update_wrapper(self, fn)
        self.__signature__ = sig

    def __eq__(self, other: object) -> bool:
        return other is self or other is self._fn

    def __hash__(self) -> int:
        return hash(self._fn)

    def __repr__(self) -> str:
        return f"<ferrodist recorded {self._name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._sending and "group_src" in kwargs and "group_dst" not in kwargs:
            kwargs["group_dst"] = kwargs.pop("group_src")
        state = _recorder._State
        rec = state.recorder if state.decided else _recorder.recorder()
        if rec is None:
            return self._fn(*args, **kwargs)
        group = self._group(args, kwargs)
        peer = _global_peer(group, self._peer(args, kwargs), self._group_peer(args, kwargs))
        if peer is None:  # a receive from any source: on its own channel until the sender shows
            channel, op = _recorder.any_source_channel(group)
        else:
            channel, op = _recorder.p2p_channel(group, peer, self._sending)
        tensors = [] if self._objects else _tensors_of(self._payload(args, kwargs))
        # both ends name the transfer alike: a send and its receive are one op of the channel
        name = op.replace("p2p", "p2p_object", 1) if self._objects else op
        caller = sys._getframe(1)
        if self._async:
            on_cpu = bool(tensors) and tensors[0].is_cpu
            return self._launch(
                name, channel, tensors, group, peer is None, on_cpu, caller, args, kwargs
            )
        ident = _recorder.begin(name, channel, tensors, caller=caller)
        result = _recorder.finish_call(ident, False, self._fn, *args, **kwargs)
        if peer is None and isinstance(result, int):  # a synchronous receive returns its sender
            _recorder.received_from(ident, group, result, self._objects)
        return result

    def _launch(
        self,
        name: str,
        channel: str,
        tensors: list[torch.Tensor],
        group: Any,
        any_source: bool,
        on_cpu: bool,
        caller: FrameType,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The asynchronous call, recorded as ``name`` on ``channel`` and held as a
        point-to-point op (``_recorder.hold_until_finished``): on CPU tensors launched
        first and recorded after, as collectives are (see the module doc), on a device recorded
        first. A receive from any source moves to its sender's channel once the recorder sees
        its work finished."""
        ident = None if on_cpu else _recorder.begin(name, channel, tensors, caller=caller)
        try:
            work = self._fn(*args, **kwargs)
        except BaseException as e:
            if on_cpu:
                ident = _recorder.begin(name, channel, tensors, started=True, caller=caller)
            _recorder.fail(ident, e)
            raise
        if on_cpu:
            ident = _recorder.begin(name, channel, tensors, started=True, caller=caller)
        else:
            _recorder.started(ident)
        if ident is None:
            return work

        def sender_known(finished: Any) -> None:
            sender = int(finished._source_rank())
            if group is not None:
                sender = _tdist.get_global_rank(group, sender)
            _recorder.received_from(ident, group, sender, self._objects)

        on_finished = sender_known if any_source else None
        _recorder.hold_until_finished(ident, work, True, on_finished, on_cpu)
        return work


def p2p(name: str, fn: Callable[..., Any], sending: bool, is_async: bool) -> Any:
    """``fn`` (a send or receive) recorded on its pair's channel."""
    return _P2P(name, fn, sending, is_async)


def _global_peer(group: Any, peer: Optional[int], group_peer: Optional[int]) -> Optional[int]:
    if peer is not None:
        return int(peer)
    if group_peer is None:
        return None
    if group is None:
        return int(group_peer)
    try:
        return int(_tdist.get_global_rank(group, group_peer))
    except Exception:
        return None
