"""Differential test: the same seeded random operations through torch's stores and ours.

Every result must be equal, and every exception ours raises must be caught by an ``except``
clause naming the class torch raised (ours may be more specific: a timeout that torch reports
as a bare ``RuntimeError`` is our ``DistStoreError``, itself a ``RuntimeError``).
"""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
import torch.distributed as tdist
from etcd_support import EtcdCluster

import ferrodist

KEYS = [f"k{i}" for i in range(8)]
VALUES: list[Any] = ["", "0", "5", "-3", "12x", "abc", b"\x00\xff", "\u00e9t\u00e9", b"41"]
OPS_PER_SEED = 700
SHORT = timedelta(milliseconds=5)

Op = Callable[[tdist.Store], Any]


def _random_op(rng: random.Random, present: set[str], file_backed: bool) -> tuple[str, Op]:
    """One random operation, as a name (for failure messages) and a function of a store."""
    key = rng.choice(KEYS)
    value = rng.choice(VALUES)
    # torch takes bytes keys too (its pybind layer turns them into std::string).
    k: str | bytes = key.encode() if rng.random() < 0.3 else key
    known = sorted(present) or [key]
    # Waiting for a key that is not there costs a timeout; torch's FileStore rounds timeouts
    # up to whole seconds, so only the in-memory stores are asked to time out.
    may_miss = not file_backed and rng.random() < 0.03
    choices: list[tuple[str, Op]] = [
        (f"set({k!r}, {value!r})", lambda s: s.set(k, value)),
        (f"add({k!r})", lambda s: s.add(k, rng_amount)),
        (
            f"compare_set({k!r}, {value!r})",
            lambda s: s.compare_set(k, value, rng_desired),
        ),
        (f"check({known[:2]!r}+{k!r})", lambda s: s.check([*known[:2], k])),
        (f"delete_key({k!r})", lambda s: s.delete_key(k)),
        ("num_keys()", lambda s: s.num_keys()),
        ("list_keys()", lambda s: sorted(s.list_keys())),
        (f"append({k!r}, {value!r})", lambda s: s.append(k, value)),
        # Equal lengths only: torch's stores disagree among themselves on a mismatch.
        (
            f"multi_set({known[:2]!r})",
            lambda s: s.multi_set(known[:2], [value, rng_desired][: len(known[:2])]),
        ),
        ("has_extended_api()", lambda s: s.has_extended_api()),
        # world_size 1 passes at once; the add + wait fallback leaves torch's two keys behind.
        (f"barrier({key!r}, 1)", lambda s: s.barrier("b" + key, 1)),
        # A FileStore clone counts in refcount/ and, once dropped, in cleanup/.
        ("clone().num_keys()", lambda s: s.clone().num_keys()),
        (f"queue_push({key!r})", lambda s: s.queue_push("q" + key, value)),
        (f"queue_len({key!r})", lambda s: s.queue_len("q" + key)),
        (f"queue_pop({key!r}, False)", lambda s: s.queue_pop("q" + key, False)),
    ]
    if present or may_miss:
        target = key if may_miss else rng.choice(known)
        choices += [
            (f"get({target!r})", lambda s: s.get(target)),
            (f"get({target.encode()!r})", lambda s: s.get(target.encode())),
            (f"wait([{target!r}])", lambda s: s.wait([target], SHORT)),
            (f"wait([{target!r}]) default", lambda s: s.wait([target])),
            (f"multi_get([{target!r}])", lambda s: s.multi_get([target, target.encode()])),
        ]
    if may_miss:
        choices.append((f"queue_pop({key!r}) blocking", lambda s: s.queue_pop("q" + key)))
    # Only what the installed torch's Store has (2.4 has no list_keys, clone or queues; 2.11
    # no barrier); each name starts with the method it calls.
    choices = [c for c in choices if hasattr(tdist.Store, c[0].split("(")[0])]
    rng_amount = rng.randint(-5, 5)
    rng_desired = rng.choice(VALUES)
    return rng.choice(choices)


def _outcome(op: Op, store: tdist.Store) -> tuple[str, Any]:
    try:
        return ("ok", op(store))
    except Exception as exc:  # the class is what we compare
        return ("raised", exc)


def _present_after(store: tdist.Store) -> set[str]:
    return {k for k in KEYS if store.check([k])}


def _run(theirs: tdist.Store, ours: tdist.Store, seed: int, file_backed: bool) -> int:
    """Runs the ops, comparing as it goes; returns how many ops raised in torch."""
    rng = random.Random(seed)
    raised = 0
    for store in (theirs, ours):
        store.set_timeout(SHORT)
    present: set[str] = set()
    for step in range(OPS_PER_SEED):
        name, op = _random_op(rng, present, file_backed)
        expected, got = _outcome(op, theirs), _outcome(op, ours)
        where = f"seed {seed} step {step}: {name}"
        if expected[0] == "raised":
            raised += 1
            assert got[0] == "raised", f"{where}: torch raised {expected[1]!r}, ours gave {got}"
            assert isinstance(got[1], type(expected[1])), f"{where}: {expected[1]!r} vs {got[1]!r}"
        else:
            assert got == expected, where
        if name.startswith(("set", "add", "compare_set", "delete", "append", "multi_set")):
            present = _present_after(theirs)
            assert present == _present_after(ours), where
    return raised


def _hash_pair(_: Path) -> tuple[tdist.Store, tdist.Store]:
    return tdist.HashStore(), ferrodist.HashStore()


def _file_pair(tmp: Path) -> tuple[tdist.Store, tdist.Store]:
    return tdist.FileStore(str(tmp / "torch"), 1), ferrodist.FileStore(str(tmp / "ours"), 1)


def _prefix_pair(_: Path) -> tuple[tdist.Store, tdist.Store]:
    return (
        tdist.PrefixStore("p", tdist.HashStore()),
        ferrodist.PrefixStore("p", ferrodist.HashStore()),
    )


def _prefix_our_file_pair(tmp: Path) -> tuple[tdist.Store, tdist.Store]:
    return (
        tdist.PrefixStore("p", tdist.FileStore(str(tmp / "torch"), 1)),
        ferrodist.PrefixStore("p", ferrodist.FileStore(str(tmp / "ours"), 1)),
    )


def _prefix_file_pair(tmp: Path) -> tuple[tdist.Store, tdist.Store]:
    # Ours over torch's own FileStore: the prefix logic in Rust, the store foreign.
    return (
        tdist.PrefixStore("p", tdist.FileStore(str(tmp / "torch"), 1)),
        ferrodist.PrefixStore("p", tdist.FileStore(str(tmp / "ours"), 1)),
    )


PAIRS = {
    "hash": (_hash_pair, False),
    "file": (_file_pair, True),
    "prefix-hash": (_prefix_pair, False),
    "prefix-file": (_prefix_our_file_pair, True),
    "prefix-over-torch-file": (_prefix_file_pair, True),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_match_torch(tmp_path: Path, pair: str, seed: int) -> None:
    make, file_backed = PAIRS[pair]
    theirs, ours = make(tmp_path)
    raised = _run(theirs, ours, seed, file_backed)
    # The error paths were compared too, not only the happy ones.
    assert raised > 10


@pytest.mark.parametrize("pair", ["hash", "file"])
def test_a_key_that_is_not_utf8_is_refused_and_changes_nothing(tmp_path: Path, pair: str) -> None:
    _, ours = PAIRS[pair][0](tmp_path)
    with pytest.raises(ValueError, match="UTF-8"):
        ours.set(b"\xff\xfe", "v")
    with pytest.raises(TypeError, match="str or bytes"):
        ours.set(3, "v")  # type: ignore[arg-type]
    assert ours.num_keys() == (0 if pair == "hash" else 1)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("prefixed", [False, True], ids=["etcd", "prefix-etcd"])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_operations_on_etcd_match_torchs_hash_store(
    etcd_cluster: EtcdCluster, etcd_prefix: str, prefixed: bool, seed: int
) -> None:
    """EtcdStore answers as torch's HashStore (one shared map, no internal keys)."""
    ours: tdist.Store = ferrodist.EtcdStore(etcd_cluster.endpoints, etcd_prefix)
    theirs: tdist.Store = tdist.HashStore()
    if prefixed:
        ours, theirs = ferrodist.PrefixStore("p", ours), tdist.PrefixStore("p", theirs)
    assert _run(theirs, ours, seed, file_backed=False) > 10
