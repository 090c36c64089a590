"""Issue 17: a missing test peer is a skip on a developer's machine and a failure under CI=true,
through one helper (``tests/conftest.py`` ``require_peer`` / ``@pytest.mark.peer``)."""

from __future__ import annotations

import pytest

from tests.conftest import require_peer


def test_a_present_peer_lets_the_test_run(monkeypatch):
    monkeypatch.setenv("CI", "true")
    require_peer("node", True)


def test_a_missing_peer_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server"):
        require_peer("redis-server", False, "apt-get install redis-server")


def test_a_missing_peer_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"nats-server.*CI=true"):
        require_peer("nats-server", False)


def test_no_test_skips_for_a_missing_peer_by_itself():
    """Every skip under tests/ for a missing program or package goes through the helper: no
    bare ``skipif(shutil.which(...))`` or ``importorskip`` is left to skip silently in CI."""
    from pathlib import Path

    root = Path(__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name in ("conftest.py", "test_peer_policy.py"):
            continue
        text = path.read_text()
        for bad in ("importorskip(", "skipif(shutil.which", "skipif(not reference"):
            if bad in text:
                offenders.append(f"{path.relative_to(root)}: {bad}")
    assert not offenders, offenders
