"""The torch-only world runs again when a rank is killed by a signal (torch's own crash), and
never when the function raises: a retry must not hide an error in Python."""

from __future__ import annotations

from pathlib import Path

import pytest
from _torch_only_world import torch_only_results


@pytest.fixture
def attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file where each probe run logs its rank (``_torch_only_world_probes``)."""
    log = tmp_path / "attempts"
    monkeypatch.setenv("PROBE_LOG", str(log))
    return log


@pytest.mark.timeout(120)
def test_a_rank_killed_by_a_signal_is_run_again(attempts: Path) -> None:
    with pytest.warns(UserWarning, match=r"retrying the torch-only world: ranks \[0"):
        results = torch_only_results("_torch_only_world_probes", "dies_on_first_attempt", 2)
    assert results == {0: 2, 1: 2}
    assert sorted(attempts.read_text().split()) == ["0", "0", "1", "1"]


@pytest.mark.timeout(120)
def test_an_error_raised_in_python_is_not_retried(attempts: Path) -> None:
    with pytest.raises(AssertionError, match="a Python error in the probe"):
        torch_only_results("_torch_only_world_probes", "always_raises", 2)
    assert sorted(attempts.read_text().split()) == ["0", "1"]
