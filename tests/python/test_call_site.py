"""The call site the flight recorder gives each op: the user's line, found once per FSDP unit's
forward and once per backward pass (``ferrodist.debug._call_site``), and always the very line a
plain walk up the whole stack finds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _procs import env, outputs_of

from ferrodist.debug import _call_site

HERE = Path(__file__).parent

pytestmark = pytest.mark.timeout(180)


def _sites(tmp_path: Path) -> dict:
    init = tmp_path / "init"
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_call_site_worker.py"), str(rank), "2", str(init)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env(),
        )
        for rank in range(2)
    ]
    outputs = outputs_of(procs, timeout=150)
    found = []
    for out in outputs:
        lines = [line for line in out.splitlines() if line.startswith("SITES ")]
        assert lines, out
        found.append(json.loads(lines[0][len("SITES ") :]))
    assert found[0] == found[1]
    return found[0]


def test_wrapper_ops_are_recorded_at_the_users_line_as_a_whole_walk_finds_it(tmp_path):
    sites = _sites(tmp_path)
    assert sites["mismatches"] == []
    assert sites["scopes_left"] == 0
    fsdp = sites["fsdp"]
    # all-gathers in the forward at the model's call, the backward's at .backward()
    assert fsdp["sites"] == sorted([fsdp["lines"]["forward"], fsdp["lines"]["backward"]])
    nested = sites["nested"]
    # a unit called from the user's own module: that module's line, not the outer call
    assert nested["sites"] == sorted(
        [nested["lines"]["unit"], nested["lines"]["op"], nested["lines"]["backward"]]
    )
    ddp = sites["ddp"]
    assert ddp["lines"]["backward"] in ddp["sites"]
    recomputed = sites["recomputed"]
    # a unit recomputed in the backward (reentrant checkpoint) is placed where the user's module
    # calls it, in the forward and in the recomputation, not at .backward(): a scope opened
    # inside the backward pass makes FSDP's own ops walk
    lines = recomputed["lines"]
    assert recomputed["sites"] == sorted([lines["inner"], lines["forward"], lines["backward"]])
    # FSDP's and DDP's own ops were placed without a walk (and, above, where a walk places them)
    for name in ("fsdp", "nested", "ddp"):
        assert sites[name]["internal_shortcuts"] > 0, name


def test_a_scope_is_let_go_of_when_its_block_raises():
    frame = sys._getframe()
    with pytest.raises(ValueError), _call_site.scope_of(frame):
        assert _call_site._marks.scopes[-1][0] is frame
        raise ValueError("boom")
    assert _call_site._marks.scopes == []
    assert _call_site.call_site().startswith("test_call_site.py:")


def test_sites_kept_by_instruction_are_the_line_of_each_call_in_a_long_function(tmp_path):
    # A user's long function, its calls at its start, in a loop at its end and twice on one
    # line: each site is the line of its call, the same line on every pass of the loop, as
    # ``f_lineno`` gives it (the cache by instruction offset must never reuse another line's).
    body = ["def main(site):", "    found = [site()]"]
    body += [f"    x{i} = {i}" for i in range(400)]
    body += ["    for _ in range(3):", "        found.append(site())"]
    body += ["    found.append(site()); found.append(site())", "    return found"]
    source = tmp_path / "long_train.py"
    source.write_text("\n".join(body) + "\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)

    def site() -> str:
        return _call_site.call_site(sys._getframe(1))

    first = namespace["main"](site)
    again = namespace["main"](site)  # every site now comes from the cache
    loop_line, last_line = 2 + 400 + 2, 2 + 400 + 3
    expected = [f"long_train.py:{line}" for line in [2] + [loop_line] * 3 + [last_line] * 2]
    assert first == expected
    assert again == expected
