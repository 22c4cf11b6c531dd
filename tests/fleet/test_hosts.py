"""Several hosts on one machine (R2): network namespaces, partitions by link and by DROP, the fleet across them.

* The rig itself (``devstack/netsim/hosts.py``): each host has its own hostname,
  pid numbering and ``/tmp``, sees the repository read-only, and reaches the others
  only over its veth; a DROP makes one service hang (not refuse), a link cut makes
  everything hang, and both heal; nothing of the run is left behind.
* The Procfile fleet on eight hosts (``python -m bench partitions --smoke``): one
  job per side crosses hosts (io downloads, a gpu host transcribes, S3 between
  them; the provider host fetches, core ingests).
* The partitions themselves (``--short``: a gpu host's link, the provider host
  from NATS) take 70 s on their own on the 2-core box, most of it one xdist worker's
  wait: more than the 7 min suite has to spare, so they run only with
  ``SWITCHYARD_PARTITIONS=1`` (and in full as ``python -m bench partitions``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.netsim import netfilter
from devstack.netsim.hosts import ROOT, Network, ip, network

CONNECT_TIMEOUT_S = 1.0
RECONNECT_BOUND_S = 30.0  # ARP re-resolving after a link comes back: seconds
HARNESS_BOUND_S = 600
PARTITIONS_ENV = "SWITCHYARD_PARTITIONS"


@pytest.fixture()
def net(tmp_path: Path) -> Iterator[Network]:
    with network(["core", "edge"], tmp_path / "hosts") as made:
        yield made


def on(net: Network, host: str, script: str) -> str:
    """``script`` (Python) run on ``host``; its stdout."""
    done = subprocess.run(net.hosts[host].argv([sys.executable, "-c", script]), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def serve(net: Network, ports: list[int]) -> subprocess.Popen[str]:
    """Listeners on core's address (accepting, never answering), up when this returns."""
    core = net.hosts["core"]
    script = ("import socket, sys, time\n"
              f"socks = [socket.create_server(({core.address!r}, p)) for p in {ports!r}]\n"
              "print('up', flush=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen(core.argv([sys.executable, "-c", script]), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def connects(net: Network, port: int) -> str:
    """What a connect from ``edge`` to core's ``port`` does: ``ok``, ``timeout`` or the error's errno name
    (its type's name when it has none)."""
    core = net.hosts["core"].address
    return on(net, "edge", (
        "import errno, socket\n"
        "try:\n"
        f"    socket.create_connection(({core!r}, {port}), timeout={CONNECT_TIMEOUT_S}).close(); print('ok')\n"
        "except TimeoutError: print('timeout')\n"
        "except OSError as e: print(errno.errorcode.get(e.errno or 0, type(e).__name__))\n"))


def wait_until_connects(net: Network, port: int) -> bool:
    deadline = time.monotonic() + RECONNECT_BOUND_S
    while time.monotonic() < deadline:
        if connects(net, port) == "ok":
            return True
    return False


def test_a_host_is_its_own_machine(net: Network) -> None:
    edge = net.hosts["edge"]
    (edge.disk / "mine").write_text("edge's file")
    out = on(net, "edge", (
        "import os, socket, pathlib\n"
        "print(socket.gethostname(), os.getpid(), sorted(os.listdir('/tmp')))\n"
        f"try: pathlib.Path({str(ROOT / 'sy-hosts-probe')!r}).write_text('x'); print('writable')\n"
        "except OSError as e: print('read-only', e.errno)\n"))
    first, repo = out.splitlines()
    name, pid, tmp = first.split(" ", 2)
    assert name == "edge" and pid == "1"  # its own hostname and pid numbering
    # its own /tmp: its disk, nothing of this machine's but, in a checkout under /tmp (mktemp -d), the
    # read-only repository's own mount point (the write probe below fails on it)
    under_tmp = ROOT.parts[1:2] == ("tmp",)
    assert tmp == str(sorted(["mine", *([ROOT.parts[2]] if under_tmp else [])]))
    assert repo.startswith("read-only")
    assert socket.gethostname() != "edge"
    assert edge.address not in ip("-4", "addr")  # this machine's network is untouched


def test_drop_hangs_one_service_silent_and_link_cuts_hang_all_and_all_heal(net: Network) -> None:
    ports = [_free_port(), _free_port()]
    server = serve(net, ports)
    try:
        assert [connects(net, p) for p in ports] == ["ok", "ok"]
        net.drop("edge", net.hosts["core"].address, ports[0])
        assert [connects(net, p) for p in ports] == ["timeout", "ok"]  # dropped, not refused: it hangs
        net.undrop("edge")
        assert [connects(net, p) for p in ports] == ["ok", "ok"]
        net.cut_silently("edge")  # every packet dropped, the link up
        assert [connects(net, p) for p in ports] == ["timeout", "timeout"]
        net.undrop("edge")
        assert [connects(net, p) for p in ports] == ["ok", "ok"]
        net.cut("edge")
        # Nothing answers: a connect hangs or, once edge's neighbour entry for core has failed (the
        # carrier loss flushed it, and its ARP went unanswered for about 3 s: a loaded box starts the
        # second probe that late), says "no route to host" at once, as a real host whose link is down
        # does. Never refused, never through.
        assert all(r in ("timeout", "EHOSTUNREACH") for r in [connects(net, p) for p in ports])
        net.heal("edge")
        # A link back up still has a failed neighbour entry for core: the first connects may say
        # "no route" until ARP resolves again, as after any real link flap.
        assert wait_until_connects(net, ports[0]) and connects(net, ports[1]) == "ok"
    finally:
        server.kill()
        server.communicate()  # waits, and closes its pipe


def test_the_rig_leaves_nothing_behind(tmp_path: Path) -> None:
    with network(["core", "edge"], tmp_path / "hosts") as made:
        names = [h.netns for h in made.hosts.values()] + [made.switch]
        sleeper = subprocess.Popen(made.hosts["edge"].argv(["sleep", "600"]))
        threading.Event().wait(0.2)  # let it enter the host; destroy must kill it wherever it is
    listed = ip("netns", "list")
    assert not [n for n in names if n in listed]
    assert sleeper.wait(10) is not None  # killed with its host


def test_netfilter_clear_is_idempotent(net: Network) -> None:
    net.undrop("edge")  # nothing to heal: no error
    assert netfilter.TABLE  # the table the DROPs live in


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def harness(*args: str, tmp_path: Path) -> dict:
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, "-m", "bench", "partitions", *args, "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=HARNESS_BOUND_S, check=False)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert done.returncode == 0, json.dumps(figures, indent=1)[-4000:]
    return figures


@pytest.mark.slow
def test_the_procfile_fleet_runs_one_job_per_side_across_hosts(tmp_path: Path) -> None:
    f = harness("--smoke", "--no-doc", tmp_path=tmp_path)
    assert f["placement"] == {"voicy_bridge.1": "vbridge", "cairn_bridge.1": "cbridge", "gpu.1": "gpu1",
                              "gpu.2": "gpu2", "io.1": "io", "provider.1": "provider", "beat.1": "beat"}
    calls = f["voicy_calls_by_host"]
    assert calls["downloaded"] == ["io"]  # the io host stored the media in S3 ...
    assert len(calls["result"]) == 1 and calls["result"][0] in ("gpu1", "gpu2")  # ... a gpu host read it there
    assert f["cairn_results_ingested"] >= 2  # the provider host's results, through core's S3 and NATS
    assert {"gpu.1@gpu1", "gpu.2@gpu2", "io.1@io", "provider.1@provider"} <= set(f["celery_nodes"])
    assert not f["down_at_end"] and not f["self_exits"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(PARTITIONS_ENV) != "1",
                    reason=f"70 s alone, beyond the suite's budget: {PARTITIONS_ENV}=1 runs it")
def test_one_partition_per_side_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    f = harness("--short", "--no-doc", tmp_path=tmp_path)
    by_name = {p["name"]: p for p in f["partitions"]}
    assert by_name["gpu-link"]["late_result_ok"] and by_name["gpu-link"]["cut_host_late_posts"] == []
    for p in f["partitions"]:
        assert (p["lost"], p["duplicate"], p["stuck"]) == (0, 0, 0), p
