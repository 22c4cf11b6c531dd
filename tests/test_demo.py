"""``make demo`` in its short mode: the embedded stack and the whole Procfile fleet, end to end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO_TIMEOUT_S = 420

pytestmark = pytest.mark.slow


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.skipif(not _port_free(5555), reason="Flower's demo port 5555 is in use on this machine")
def test_demo_short_mode_completes_both_sides() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_"))}
    proc = subprocess.run([sys.executable, "-m", "deploy.demo", "--short", "--timeout", "300"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = [line for line in out.splitlines() if line.startswith("SUMMARY ")]
    assert summary == ["SUMMARY voicy_completed=3/3 cairn_activities=5/5 cairn_rejected=0 status=ok"], out[-4000:]
    assert "Flower: http://127.0.0.1:5555" in out
    assert "== transcripts ==" in out and "market" in out.lower()
    assert "ACTIVITY_TYPE_" in out
