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


NOT_PEER_SKIPS = {
    # path under tests/ -> text of a skip that is about the data, not about a missing peer
    "archives/test_layout.py": "no single-message body of exactly",
    "tmpfs.py": "which needs root",  # issue 15: a full-disk test is skipped when not root
}


def test_no_test_skips_for_a_missing_peer_by_itself():
    """Every skip under tests/ goes through the helper (``require_peer`` or
    ``@pytest.mark.peer``), so none can skip silently in CI: a bare ``skipif``,
    ``importorskip`` or ``pytest.skip`` is allowed only where ``NOT_PEER_SKIPS`` says it is
    about something else than a missing peer."""
    from pathlib import Path

    root = Path(__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in ("conftest.py", "test_peer_policy.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(bad in line for bad in ("skipif(", "importorskip(", "pytest.skip(")):
                allowed = NOT_PEER_SKIPS.get(rel)
                if allowed is None or allowed not in line:
                    offenders.append(f"tests/{rel}:{n}: {line.strip()}")
    assert not offenders, "skip through tests/conftest.py require_peer: " + "; ".join(offenders)
