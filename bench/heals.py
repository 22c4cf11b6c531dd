"""How soon a host cut off silently (every packet dropped, no RST, its link up) works again after the heal (D1)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.infra.procfile import entries as procfile_entries
from devstack.infra.services import find_binary
from devstack.infra.stack import ROOT
from devstack.netsim.hosts import Network, network

REDIS_PORT = 6379  # on core's own address: the only Redis of the run
CORE, WORKER = "core", "w1"
CUT_S = 20.0  # longer than a BRPOP's reply may be late before kombu drops its connection
READY_TIMEOUT_S = 60.0
HEAL_LIMIT_S = 60.0  # how long the probe waits for a task after the heal before it reports a failure
PROBE_TASK = "celery.accumulate"  # Celery's built-in echo: broker, pool and result backend, nothing else
PROBE_WAIT_S = 0.5  # one wait for the probe's result; the probe sends again after each
WORKER_QUEUES = {"gpu": "gpu", "io": "io", "provider": "provider.strava-fetcher"}  # each Procfile worker's
BEAT = "beat"
BEAT_QUEUE = "io"  # where beat sends Voicy's housekeeping (nobody consumes it here: the list grows)
# A Voicy schedule whose heartbeat goes out every second: beat sending again is seen within one period.
BEAT_ENV = {"VOICY_WORKER_API_URL": "http://127.0.0.1:9", "VOICY_WORKER_TOKEN": "heals-probe",
            "VOICY_WORKER_HEARTBEAT_INTERVAL_MS": "1000"}


@dataclass
class Heal:
    """One cut and heal: how long the cut lasted and how soon after the heal a new task came back."""

    process: str
    cut_s: float
    works_again_after_s: float | None


# Runs on core: one task to the worker's queue, its result awaited, as often as needed.
PROBE = """
import sys, time
from celery import Celery
app = Celery(broker=sys.argv[1], backend=sys.argv[1])
queue, limit, wait_s = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
started = time.monotonic()
pending = []
while time.monotonic() - started < limit:
    pending.append(app.send_task({task!r}, args=(1,), queue=queue))
    for result in pending:
        try:
            result.get(timeout=wait_s / len(pending))
        except Exception:
            continue
        print(round(time.monotonic() - started, 2), flush=True)
        sys.exit(0)
print("none", flush=True)
""".replace("{task!r}", repr(PROBE_TASK))


# Runs on core: how soon beat's next message lands in its queue.
BEAT_PROBE = """
import sys, time
import redis
client = redis.Redis.from_url(sys.argv[1])
queue, limit = sys.argv[2], float(sys.argv[3])
started = time.monotonic()
before = client.llen(queue)
while time.monotonic() - started < limit:
    if client.llen(queue) > before:
        print(round(time.monotonic() - started, 2), flush=True)
        sys.exit(0)
    time.sleep(0.05)
print("none", flush=True)
"""


# Runs on core: one task sent (or, for beat's queue, nothing: beat is the sender).
SEND_ONE = """
import sys
from celery import Celery
if sys.argv[2] != {beat!r}:
    Celery(broker=sys.argv[1]).send_task({task!r}, args=(0,), queue=sys.argv[2])
""".replace("{task!r}", repr(PROBE_TASK)).replace("{beat!r}", repr(BEAT))


def send_one(net: Network, redis_url: str, queue: str) -> None:
    """A task sent during the cut, as work keeps arriving during a real partition: Redis hands it to the
    cut worker's pending BRPOP and its reply is retransmitted into the cut with growing backoff."""
    subprocess.run(net.hosts[CORE].argv([sys.executable, "-c", SEND_ONE, redis_url, queue]), cwd=ROOT,
                   capture_output=True, timeout=READY_TIMEOUT_S, check=True)


def probe(net: Network, redis_url: str, queue: str, limit_s: float) -> float | None:
    """Seconds from now until a task sent to ``queue`` (sent again every ``PROBE_WAIT_S``) returned."""
    script = BEAT_PROBE if queue == BEAT else PROBE
    argv = net.hosts[CORE].argv([sys.executable, "-c", script, redis_url, BEAT_QUEUE if queue == BEAT else queue,
                                 str(limit_s), str(PROBE_WAIT_S)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s + 30, cwd=ROOT, check=False)
    out = done.stdout.strip().splitlines()
    if done.returncode != 0 or not out or out[-1] == "none":
        return None
    return float(out[-1])


def measure(workdir: Path, process: str = "io", cut_s: float = CUT_S, *, redis_down: bool = False) -> Heal:
    """A fresh two-host network: Redis on core, the Procfile's ``process`` line on w1; cut w1, heal it.

    With ``redis_down`` nothing is cut: Redis is killed for ``cut_s`` and started again, so the worker
    meets refused connections and its own reconnect's waits decide how soon it works again."""
    with network([CORE, WORKER], workdir / "hosts") as net:
        core = net.hosts[CORE]
        redis_url = f"redis://{core.address}:{REDIS_PORT}/0"
        redis_argv = core.argv([find_binary("redis-server"), "--bind", core.address, "--port", str(REDIS_PORT),
                                "--save", "", "--appendonly", "no"])
        redis_proc = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = (workdir / f"{process}.log").open("w")
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "REDIS_URL": redis_url,
               "PYTHONUNBUFFERED": "1", "HOME": "/tmp", "IO_CONCURRENCY": "1", "PROVIDER_CONCURRENCY": "1",
               "HONCHO_PROCESS_NAME": process, **(BEAT_ENV if process == BEAT else {})}
        worker = subprocess.Popen(net.hosts[WORKER].argv(["bash", "-c", procfile_entries(ROOT / "Procfile")[process]]),
                                  env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            queue = WORKER_QUEUES.get(process, BEAT)
            if probe(net, redis_url, queue, READY_TIMEOUT_S) is None:
                raise RuntimeError(f"{process} never answered before the cut: {(workdir / f'{process}.log')}")
            if redis_down:
                redis_proc.kill()
                redis_proc.wait()
                time.sleep(cut_s)  # the outage's length is the measurement's input, not an awaited event
                redis_proc = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            else:
                net.cut_silently(WORKER)
                send_one(net, redis_url, queue)  # popped by the worker's pending fetch: its reply is lost in the cut
                time.sleep(cut_s)  # the partition's length is the measurement's input, not an awaited event
                net.undrop(WORKER)
            return Heal(process, cut_s, probe(net, redis_url, queue, HEAL_LIMIT_S))
        finally:
            worker.kill()
            redis_proc.kill()
            worker.wait()
            redis_proc.wait()
            log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.heals")
    parser.add_argument("--process", default="io", choices=[*WORKER_QUEUES, BEAT])
    parser.add_argument("--cut-s", type=float, default=CUT_S)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/sy-heals"))
    parser.add_argument("--redis-down", action="store_true",
                        help="kill Redis for --cut-s seconds instead of cutting the host off")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    heal = measure(args.workdir, args.process, args.cut_s, redis_down=args.redis_down)
    print(json.dumps(heal.__dict__))
    return 0 if heal.works_again_after_s is not None else 1


if __name__ == "__main__":
    sys.exit(main())
