"""What torch's own TCPStore tests read: the client's handshake on the wire and the ``repr``.

torch's protocol test accepts one connection, reads VALIDATE and PING, expects the PING's nonce to
be the client's process id, echoes it and closes; its ``repr`` test matches
``TCPStore(client=TCPClient(SocketImpl(fd=N, addr=..., remote=...)), server=...)`` with a
regular expression. Both are run here against torch's TCPStore and ferrodist's alike.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch
import torch.distributed as tdist

import ferrodist

SHORT = timedelta(seconds=10)
VALIDATE = struct.pack("<BI", 0, 0x3C85F7CE)

# torch 2.13's test_repr patterns (loopback written as localhost; \[? allows IPv6 brackets).
SOCKET = r"SocketImpl\(fd=\d+, addr=\[?localhost\]?:\d+, remote=\[?localhost\]?:\d+\)"
MASTER_REPR = rf"TCPStore\(client=TCPClient\({SOCKET}\), server=TCPServer\(port=\d+\)\)"
CLIENT_REPR = rf"TCPStore\(client=TCPClient\({SOCKET}\), server=<nullptr>\)"

TORCH_VERSION = tuple(int(part) for part in torch.__version__.split(".")[:2])

STORES: dict[str, Callable[..., Any]] = {"torch": tdist.TCPStore, "ferrodist": ferrodist.TCPStore}


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("side", sorted(STORES))
def test_the_first_ping_carries_the_process_id_and_is_all_a_peer_needs_to_answer(side: str) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: dict[str, Any] = {}

    def peer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            seen["validate"] = _read_exact(conn, 5)
            seen["opcode"] = _read_exact(conn, 1)
            (seen["nonce"],) = struct.unpack("<I", _read_exact(conn, 4))
            conn.sendall(struct.pack("<I", seen["nonce"]))

    if side == "torch" and TORCH_VERSION < (2, 5):
        pytest.skip("torch 2.4's client sends no PING (its servers have none)")
    thread = threading.Thread(target=peer)
    thread.start()
    try:
        STORES[side](
            "127.0.0.1", port, world_size=2, is_master=False, timeout=SHORT, wait_for_workers=False
        )
    finally:
        thread.join(timeout=30)
        listener.close()
    assert seen == {"validate": VALIDATE, "opcode": b"\x0d", "nonce": os.getpid()}


def _shape(text: str) -> str:
    """A repr with its numbers and addresses taken out."""
    text = re.sub(r"(addr|remote)=[^,)]+", r"\1=ADDR", text)
    return re.sub(r"\d+", "N", text)


def test_repr_without_torchs_is_ferrodists_own() -> None:
    master = ferrodist.TCPStore("localhost", 0, 1, True, timeout=SHORT)
    ours = f"ferrodist.TCPStore(host='localhost', port={master.port}, server)"
    if "__repr__" in vars(tdist.TCPStore):  # 2.13 and 2.15 have one; 2.4 does not
        assert repr(master).endswith(" " + ours)
    else:
        assert repr(master) == ours


def test_repr_has_torchs_shape_and_matches_torchs_patterns() -> None:
    if "__repr__" not in vars(tdist.TCPStore):
        pytest.skip("this torch's TCPStore has no repr of its own (torch 2.4): nothing to match")
    master = ferrodist.TCPStore("localhost", 0, 1, True, timeout=SHORT)
    client = ferrodist.TCPStore(master.host, master.port, 2, False, timeout=SHORT)
    assert re.search(MASTER_REPR, repr(master)), repr(master)
    assert re.search(CLIENT_REPR, repr(client)), repr(client)
    ours = f"ferrodist.TCPStore(host='localhost', port={master.port}, server)"
    assert repr(master).endswith(ours)

    torch_master = tdist.TCPStore("localhost", 0, 1, True, timeout=SHORT)
    torch_client = tdist.TCPStore(torch_master.host, torch_master.port, 2, False, timeout=SHORT)
    for ours, theirs in ((master, torch_master), (client, torch_client)):
        torch_part = repr(ours).split(" ferrodist.TCPStore(")[0]
        assert _shape(torch_part) == _shape(repr(theirs))


def test_repr_names_the_connections_fd_and_ports() -> None:
    if "__repr__" not in vars(tdist.TCPStore):
        pytest.skip("this torch's TCPStore has no repr of its own (torch 2.4): ours is kept")
    master = ferrodist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT)
    match = re.search(r"fd=(\d+), addr=localhost:(\d+), remote=localhost:(\d+)", repr(master))
    assert match, repr(master)
    fd, local_port, remote_port = (int(g) for g in match.groups())
    assert int(remote_port) == master.port
    sock = socket.socket(fileno=os.dup(fd))
    try:
        assert sock.getsockname()[1] == local_port
        assert sock.getpeername()[1] == master.port
    finally:
        sock.close()


def test_repr_of_a_store_whose_constructor_raised_does_not_raise() -> None:
    # A traceback shows the half-made ``self``: its repr must not raise there.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    half_made = ferrodist.TCPStore.__new__(ferrodist.TCPStore)
    assert repr(half_made) == "ferrodist.TCPStore(<not connected>)"
    with pytest.raises(tdist.DistNetworkError) as refused:
        ferrodist.TCPStore("127.0.0.1", port, timeout=timedelta(milliseconds=300))
    shown = str(refused.getrepr(showlocals=True))
    assert "self       = ferrodist.TCPStore(<not connected>)" in shown
    assert "raised in repr()" not in shown
