"""``make demo``: the main job on the embedded stack, unattended, from a fresh machine.

1. Starts deploy/devstack: Redis, nats-server (JetStream), moto S3, the dev
   Voicy Worker API, the dev Cairn core, fake Telegram and the provider fake
   of every Cairn pool the Procfile runs (``procfile.pools``).
2. Starts the whole Procfile fleet on loopback, one process per type, as
   Heroku runs it (``devstack.infra.procfile``; Flower on
   http://127.0.0.1:5555, user ``demo``, password printed at start). Each
   process logs to its own file in a directory kept after the demo exits.
3. Enqueues the voice fixtures (and, in the full run, one long message stitched
   from them) and connects one account on each pool, at that pool's fake, with
   as many activities as its kit's ``demo_size`` says.
4. Draws a bar per transcription from the segments the worker streams (the
   parts of its progress posts), and labelled Cairn counters per pool; then
   prints the transcripts and each pool's imported activities in date order,
   and a summary.
5. Asks ``switchyard health`` for the running fleet's verdict, and after the
   stop reads every process's log against the log budget: the ``HEALTH`` line
   (``devstack/demo_health.py``). ``--serve`` keeps it all up before the stop.

Stopping (the end of the run, Ctrl-C or SIGTERM) goes in dependency order:
the fleet first (SIGTERM to every process, SIGKILL only after 30 s, as on
Heroku), then the Cairn stack (its fakes, the dev core, NATS: the devstack
kit, ``devstack/infra/cairn_stack.py``), the Voicy fakes, then S3 and Redis,
so no process ever loses a service under it.
Redis and NATS run in sessions of their own, so a Ctrl-C reaches only the demo.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import shutil
import sys
import tempfile
import time
import wave
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from faster_whisper.audio import decode_audio

from devstack import demo_health, demo_webhook
from devstack.fakes.provider_fake import Connected, DemoSize, ProviderFake
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.infra import procfile, services
from devstack.infra.cairn_stack import FAKE_KITS, CairnStack, Pool, clean_env
from devstack.infra.stack import AUDIO_DIR, BOT_TOKEN, TINY_MODEL_DIR, audio_manifest
from devstack.interrupts import signals_ignored, stop_on_ctrl_c, wait_for_ctrl_c

FLOWER_PORT = 5555
DEMO_TIMEOUT_S = 600.0
REFRESH_S = 0.25  # redraw period on a terminal
PLAIN_PRINT_INTERVAL_S = 5.0  # print period when stdout is not a terminal (CI, a pipe)
BAR_WIDTH = 30
DEMO_STACK_NAME = "demo"  # core's bucket is cairn-demo
# Every worker line runs at its Procfile default divided by this: one box hosts the whole fleet.
CONCURRENCY_DIVISOR = 2
SHORT_FIXTURES = 2
ACTIVITIES_SHOWN = 25
TRANSCRIPT_SHOWN_CHARS = 600  # the long message's transcript is cut here in the summary
SAMPLE_RATE_HZ = 16_000  # the long message is written as 16 kHz mono PCM WAV
LONG_MESSAGE_STORIES = 3  # the long message: the longest fixture this many times, then every short one
EXIT_INTERRUPTED = 130  # the shell's code for a command ended by SIGINT

DESCRIPTION = """\
Run the whole Switchyard fleet on an embedded stack and show both sides working.

Starts Redis, NATS JetStream, S3 (moto), a dev Voicy Worker API, a dev Cairn
core, fake Telegram and a fake API per Cairn provider on 127.0.0.1, then the
Procfile fleet, one process per type (Flower on http://127.0.0.1:5555), with
every Cairn pool the Procfile names side by side. Enqueues voice messages,
connects an account on each pool, draws a bar per transcription from the
segments the worker streams, counts what Cairn core published and received
per pool, and prints the transcripts and each pool's imported activities;
then the fleet's health verdict and its log budget (the HEALTH line).

Cairn pools (the Procfile's): {pools}.

Ctrl-C stops the fleet first, then the fake services, NATS and Redis."""
EPILOG = """\
make demo runs it with no option; pass options with make demo ARGS="--short --serve".
exit status: 0 when every job completed and the fleet is healthy (switchyard
health, and no WARNING, ERROR or traceback in its logs beyond the allow-list),
1 when the run timed out, a job failed or the fleet is unhealthy, 130 when
interrupted before the summary.
The fleet's logs (one file per process) are kept after the demo exits."""


def procfile_pools() -> list[Pool]:
    """The Cairn pools the demo runs: those of the Procfile whose provider is installed."""
    return procfile.pools(procfile.runnable(procfile.entries())[0])


def demo_size(pool: Pool) -> DemoSize:
    return FAKE_KITS[pool.provider].demo_size


def say(text: str) -> None:
    print(text, flush=True)


# --- what the demo sends -------------------------------------------------------------------------
def fixtures(short: bool) -> list[dict[str, Any]]:
    items = sorted(audio_manifest(), key=lambda m: m["duration_s"])
    return items[:SHORT_FIXTURES] + [items[-1]] if short else items


def long_message(items: list[dict[str, Any]]) -> tuple[bytes, float]:
    """One message of about two minutes stitched from the fixtures (WAV), and its duration in seconds.

    Why: a worker posts progress at most once per ``VOICY_WORKER_PROGRESS_INTERVAL_MS``
    (1 s at least), and the tiny model hears a 36-second fixture in about two seconds,
    so only a message of minutes streams enough progress for its bar to fill visibly.
    """
    longest = max(items, key=lambda m: m["duration_s"])
    order = [longest] * LONG_MESSAGE_STORIES + [m for m in items if m is not longest]
    audio = np.concatenate([decode_audio(str(AUDIO_DIR / m["file"]), sampling_rate=SAMPLE_RATE_HZ)
                            for m in order])
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE_HZ)
        out.writeframes((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())
    return buf.getvalue(), len(audio) / SAMPLE_RATE_HZ


# --- what the demo shows -------------------------------------------------------------------------
def seconds(time_code: str) -> float:
    """``MM:SS`` (minutes may exceed 59) -> seconds."""
    minutes, _, secs = time_code.partition(":")
    return int(minutes) * 60 + int(secs or 0)


def clock(secs: float) -> str:
    return f"{int(secs) // 60:02d}:{int(secs) % 60:02d}"


def heard_s(job: dict[str, Any]) -> float:
    """How far into the audio the streamed segments reach: the start of the last part posted so far."""
    parts = job.get("resultParts") or job.get("partialResultParts") or []
    return seconds(parts[-1]["timeCode"]) if parts else 0.0


def bar(name: str, job: dict[str, Any], duration_s: float) -> str:
    done = job["status"] == "completed"
    heard = duration_s if done else min(heard_s(job), duration_s)
    fill = int(BAR_WIDTH * heard / max(duration_s, 1.0))
    parts = len(job.get("resultParts") or job.get("partialResultParts") or [])
    return (f"  {name:<8} [{'#' * fill}{'.' * (BAR_WIDTH - fill)}] {clock(heard)}/{clock(duration_s)} "
            f"{job['status']}" + (f", {parts} parts" if parts else ""))


def activity_payloads(results: list[Any]) -> list[dict[str, Any]]:
    """Every imported activity's payload, in date order (RFC 3339 UTC strings sort by time)."""
    payloads = [ev["activity"].get("payload", {}) for r in results for ev in r.data.get("events", [])
                if "activity" in ev]
    return sorted(payloads, key=lambda p: p.get("startTime", ""))


class Demo:
    def __init__(self, short: bool, tmp: Path, log_dir: Path) -> None:
        self.short, self.tmp, self.log_dir = short, tmp, log_dir
        self.fleet: procfile.Fleet | None = None
        self.env: dict[str, str] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pools = procfile_pools()
        self.expected = {p.worker_name: demo_size(p).short if short else demo_size(p).full for p in self.pools}
        self.connected: list[Connected] = []
        self.flower_password = secrets.token_urlsafe(12)
        # (what, how to stop it), in start order; close() stops them in reverse.
        self._started: list[tuple[str, Callable[[], None]]] = []

    def _started_as(self, what: str, stop: Callable[[], None]) -> None:
        self._started.append((what, stop))

    def start_stack(self) -> None:
        say("starting the embedded stack (Redis, S3, dev Voicy, NATS JetStream, dev Cairn core, fakes)")
        self.redis = services.start_redis(self.tmp / "redis")
        self._started_as("Redis", self.redis.stop)
        self.s3 = services.start_moto()
        self._started_as("S3", lambda: services.stop_moto(self.s3))
        self.voicy = DevVoicyServer().start()
        self._started_as("the dev Voicy API", self.voicy.stop)
        self.telegram = FakeTelegram(BOT_TOKEN).start()
        self._started_as("fake Telegram", self.telegram.stop)
        self.kits: dict[str, ProviderFake] = {p.provider: FAKE_KITS[p.provider]() for p in self.pools}
        self.cairn = CairnStack(self.tmp / "cairn", redis_url=self.redis.url, s3_endpoint=self.s3.url,
                                fakes=list(self.kits.values()), name=DEMO_STACK_NAME,
                                pools=self.pools)  # core's worker template
        self._started_as("the Cairn stack (the fakes, the dev Cairn core, NATS)", self.cairn.stop)
        self.cairn.start()
        assert self.cairn.core is not None and self.cairn.nats is not None
        self.core = self.cairn.core
        fakes = ", ".join(f"fake {provider} {next(iter(kit.pool_env().values()))}"
                          for provider, kit in self.kits.items())
        say(f"stack: Redis {self.redis.url}, NATS {self.cairn.nats.url}, S3 {self.s3.url}, "
            f"dev Voicy {self.voicy.url}, fake Telegram {self.telegram.url}, {fakes}")

    def fleet_env(self) -> dict[str, str]:
        env = clean_env()  # no ambient deployment's variables, no CA bundle overriding the fakes'
        env.update({
            "REDIS_URL": self.redis.url, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
            "VOICY_WORKER_API_URL": self.voicy.url, "VOICY_WORKER_TOKEN": self.voicy.create_client("demo"),
            "VOICY_WORKER_TELEGRAM_API_URL": self.telegram.url, "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN,
            "VOICY_WORKER_MODEL": TINY_MODEL_DIR, "VOICY_WORKER_WORK_DIR": str(self.tmp / "media"),
            "VOICY_WORKER_PROGRESS_INTERVAL_MS": "1000", "VOICY_WORKER_LEASE_TTL_MS": "5000",
            "FLOWER_USER": "demo", "FLOWER_PASSWORD": self.flower_password,
            "PATH": f"{Path(sys.executable).parent}:" + os.environ.get("PATH", ""),
        })
        env.update({var: str(max(1, n // CONCURRENCY_DIVISOR))
                    for var, n in procfile.concurrency(procfile.entries()).items()})
        for pool in self.pools:  # the Procfile's lines name each pool's provider and name; its login is its own
            env.update(self.cairn.pool_env(pool, scoped=True))
        env.update(demo_webhook.fleet_env())  # the webhook leg (devstack/demo_webhook.py)
        return env

    def start_fleet(self) -> None:
        say(f"starting the Procfile fleet; its logs, one per process: {self.log_dir} (kept after the demo exits)")
        for name, provider in procfile.runnable(procfile.entries())[1].items():
            say(f"  {name}: not started, provider {provider} is not installed")
        self.env = self.fleet_env()
        self.fleet = procfile.start(self.env, self.log_dir, FLOWER_PORT)
        self._started_as("the fleet", self._stop_fleet)
        say(f"Flower: http://127.0.0.1:{FLOWER_PORT}  (user demo, password {self.flower_password})")

    def enqueue(self) -> None:
        items = fixtures(self.short)
        for item in items:
            data = (AUDIO_DIR / item["file"]).read_bytes()
            self._enqueue_voice(item["name"], data, item["duration_s"])
        if not self.short:
            data, duration_s = long_message(audio_manifest())
            self._enqueue_voice("long", data, duration_s, mime_type="audio/wav", source_kind="audio",
                                file_name="long.wav")
        self.connected = [self.kits[p.provider].connect(self.core, p, self.expected[p.worker_name])
                          for p in self.pools]
        for connected in self.connected:
            self.core.schedule_reconcile(connected.account_id)
        say(f"enqueued {len(self.jobs)} voice messages, connected " + "; ".join(
            f"a {p.provider} account with {self.expected[p.worker_name]} activities on pool {p.worker_name}"
            for p in self.pools))
        say("cairn: core publishes one reconcile job per account; each pool lists its account and enqueues one "
            "fetch_source job per activity itself, so core receives more results than it published jobs")

    def _enqueue_voice(self, name: str, data: bytes, duration_s: float, **job: Any) -> None:
        file_id = f"demo-{name}"
        self.telegram.add_file(file_id, data)
        job_id = self.voicy.enqueue_job(file_id, file_size=len(data), **job)
        self.jobs[job_id] = {"name": name, "duration_s": duration_s}

    # --- live view -------------------------------------------------------------------------------
    def _activity_results(self, pool: str) -> list[Any]:
        """The pool's results that import an activity (an import_gear result is ``events`` too)."""
        return [r for r in self.core.ingested if r.kind == "events" and r.pool == pool
                and any("activity" in ev for ev in r.data.get("events", []))]

    def rows(self) -> list[str]:
        rows = [bar(item["name"], self.voicy.get_job(job_id), item["duration_s"])
                for job_id, item in self.jobs.items()]
        kinds = Counter(r.kind for r in self.core.ingested)
        rows.append(f"  cairn: jobs published by core {len(self.core.published_jobs)} | results accepted by "
                    f"core {sum(kinds.values())} (activity {kinds['events']}, reconcile {kinds['reconcile']}, "
                    f"failure {kinds['failure']}) | results rejected {len(self.core.rejected)}")
        rows.append("  cairn: activities imported " + " | ".join(  # each pool's own
            f"{p.worker_name} ({p.provider}) {len(self._activity_results(p.worker_name))}/"
            f"{self.expected[p.worker_name]}" for p in self.pools))
        return rows

    def done(self) -> bool:
        voicy = all(self.voicy.get_job(j)["status"] in ("completed", "failed") for j in self.jobs)
        return voicy and all(len(self._activity_results(pool)) >= n for pool, n in self.expected.items())

    def watch(self, timeout_s: float) -> bool:
        tty = sys.stdout.isatty()
        deadline = time.monotonic() + timeout_s
        last_print = float("-inf")
        drawn = 0
        while time.monotonic() < deadline:
            exited = self.fleet.exited() if self.fleet is not None else []
            if exited:
                say(f"fleet process {', '.join(exited)} exited early; see its log in {self.log_dir}")
                return False
            rows, finished = self.rows(), self.done()
            if tty:
                sys.stdout.write(("\x1b[F" * drawn) + "\n".join(r + "\x1b[K" for r in rows) + "\n")
                sys.stdout.flush()
                drawn = len(rows)
            elif finished or time.monotonic() - last_print >= PLAIN_PRINT_INTERVAL_S:
                say("\n".join(rows))
                last_print = time.monotonic()
            if finished:
                return True
            time.sleep(REFRESH_S)
        say(f"gave up waiting after {timeout_s:.0f} s")
        return False

    def summary(self) -> int:
        say("\n== transcripts ==")
        completed = 0
        for job_id, item in self.jobs.items():
            job = self.voicy.get_job(job_id)
            completed += job["status"] == "completed"
            text = str(job.get("resultText", job.get("lastError", "")))
            if len(text) > TRANSCRIPT_SHOWN_CHARS:
                text = f"{text[:TRANSCRIPT_SHOWN_CHARS]}… ({len(text)} characters)"
            say(f"[{item['name']}] {job['status']}: {text}")
        for pool in self.pools:
            say(f"\n== imported activities of pool {pool.worker_name} ({pool.provider}), by start time ==")
            for p in activity_payloads(self._activity_results(pool.worker_name))[:ACTIVITIES_SHOWN]:
                say(f"  {p.get('startTime', '?')}  {p.get('type', '?'):<22} {p.get('title', '')}")
        say("\npools: " + " | ".join(f"{p.worker_name} ({p.provider}): {len(self.core.live_presence(p.worker_name))} "
                                     f"live, {len(self._activity_results(p.worker_name))} activities"
                                     for p in self.pools))
        ok = completed == len(self.jobs) and self.done()
        imported = " ".join(f"{p.provider}_activities={len(self._activity_results(p.worker_name))}/"
                            f"{self.expected[p.worker_name]}" for p in self.pools)
        say(f"\nSUMMARY voicy_completed={completed}/{len(self.jobs)} {imported} "
            f"cairn_rejected={len(self.core.rejected)} status={'ok' if ok else 'incomplete'}")
        return 0 if ok else 1

    # --- stopping --------------------------------------------------------------------------------
    def _stop_fleet(self) -> None:
        assert self.fleet is not None
        started = time.monotonic()
        killed = self.fleet.stop()
        say(f"  fleet stopped in {time.monotonic() - started:.1f} s"
            + (f"; SIGKILLed after {procfile.STOP_GRACE_S:.0f} s: {', '.join(killed)}" if killed
               else ", every process exited on SIGTERM"))

    def close(self) -> None:
        """Stop what started, newest first: the fleet, core and the fakes, then S3, NATS, Redis."""
        while self._started:
            what, stop = self._started.pop()
            say(f"stopping {what}")
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest; say what went wrong
                say(f"  {what} did not stop cleanly: {type(exc).__name__}: {exc}")
        say("stack stopped")


def parser() -> argparse.ArgumentParser:
    pools = procfile_pools()
    names = ", ".join(f"{pool.worker_name} ({pool.provider})" for pool in pools)
    p = argparse.ArgumentParser(prog="python -m devstack.demo", description=DESCRIPTION.format(pools=names),
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = ", ".join(f"{demo_size(pool).short} instead of {demo_size(pool).full} on {pool.worker_name}"
                      for pool in pools)
    p.add_argument("--short", action="store_true",
                   help=f"{SHORT_FIXTURES + 1} voice messages instead of every fixture and a long message, and "
                        f"fewer activities ({sizes}; what the tests run)")
    p.add_argument("--serve", action="store_true",
                   help="keep the stack and the fleet up after the run, until Ctrl-C")
    p.add_argument("--timeout", type=float, default=DEMO_TIMEOUT_S, metavar="SECONDS",
                   help="stop waiting for the jobs after this many seconds (default: %(default).0f)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stop_on_ctrl_c()
    tmp = Path(tempfile.mkdtemp(prefix="switchyard-demo-"))
    log_dir = Path(tempfile.mkdtemp(prefix="switchyard-demo-logs-"))
    demo = Demo(args.short, tmp, log_dir)
    code = EXIT_INTERRUPTED
    verdict: demo_health.Verdict | None = None
    try:
        demo.start_stack()
        demo.start_fleet()
        demo.enqueue()
        demo.watch(args.timeout)
        code = demo.summary()
        code = max(code, demo_webhook.run_for(demo.core, demo.connected, demo.kits))
        verdict = demo_health.check_fleet(demo.env)
        demo_health.show(verdict)  # now, while the fleet runs: --serve waits for Ctrl-C below
        if args.serve:
            say("serving; press Ctrl-C to stop")
            wait_for_ctrl_c()
    except KeyboardInterrupt:
        say("\ninterrupted: stopping the fleet first, then the stack")
    finally:
        with signals_ignored():
            demo.close()
            shutil.rmtree(tmp, ignore_errors=True)
    if verdict is not None:  # the log budget reads the logs of the stopped fleet: its stop is in them
        code = max(code, demo_health.report(verdict, log_dir))
    if any(log_dir.iterdir()):
        say(f"the fleet's logs are kept in {log_dir}")
    else:
        log_dir.rmdir()
    return code


if __name__ == "__main__":
    sys.exit(main())
