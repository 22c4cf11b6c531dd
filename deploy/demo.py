"""``make demo``: the main job on the embedded stack, unattended, from a fresh machine.

1. Starts deploy/devstack: Redis, nats-server (JetStream), moto S3, the dev
   Voicy Worker API, the dev Cairn core, fake Telegram and fake Strava.
2. Starts the whole Procfile fleet with honcho on loopback (Flower on
   http://127.0.0.1:5555, user ``demo``, password printed at start).
3. Enqueues the voice fixtures and connects a fake Strava athlete.
4. Shows a progress bar per transcription (moving as segments arrive) and
   counters for Cairn jobs and results, then prints the transcripts and the
   imported activities, and exits 0 with a summary. ``--serve`` keeps it all up.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

from deploy import demo_webhook
from deploy.devstack import services
from deploy.devstack.procs import Proc, spawn

ROOT = Path(__file__).resolve().parents[1]
FLOWER_PORT = 5555
DEMO_TIMEOUT_S = 600.0
FLEET_STOP_TIMEOUT_S = 30.0  # SIGTERM to the honcho group at exit, SIGKILL if it is still up after this
REFRESH_S = 0.25
BAR_WIDTH = 30
ATHLETE_ID = 424242
FULL_ACTIVITIES = 20
SHORT_ACTIVITIES = 5
SHORT_FIXTURES = 2


def _fixtures(short: bool) -> list[dict]:
    from tests.voicy_stack import audio_manifest

    items = sorted(audio_manifest(), key=lambda m: m["duration_s"])
    return items[:SHORT_FIXTURES] + [items[-1]] if short else items


class Demo:
    def __init__(self, short: bool, tmp: Path) -> None:
        from deploy.devstack.cairn_core import DevCairnCore
        from deploy.devstack.strava import FakeStrava
        from deploy.devstack.telegram import FakeTelegram
        from deploy.devstack.voicy_api import DevVoicyServer
        from tests.voicy_stack import BOT_TOKEN, TINY_MODEL_DIR

        self.short, self.tmp = short, tmp
        print("starting the embedded stack (Redis, NATS JetStream, S3, dev Voicy, dev Cairn core, fakes)")
        self.redis = services.start_redis(tmp / "redis")
        self.nats = services.start_nats(tmp / "nats")
        self.s3 = services.start_moto()
        self.voicy = DevVoicyServer().start()
        self.telegram = FakeTelegram(BOT_TOKEN).start()
        self.strava = FakeStrava().start()
        self.core = DevCairnCore(self.nats.url, self.s3.url, bucket="cairn-demo")
        self.core.start()
        self.flower_password = secrets.token_urlsafe(12)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_"))}
        self.env.update({
            "REDIS_URL": self.redis.url, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
            "VOICY_WORKER_API_URL": self.voicy.url, "VOICY_WORKER_TOKEN": self.voicy.create_client("demo"),
            "VOICY_WORKER_TELEGRAM_API_URL": self.telegram.url, "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN,
            "VOICY_WORKER_MODEL": TINY_MODEL_DIR, "VOICY_WORKER_WORK_DIR": str(tmp / "media"),
            "VOICY_WORKER_PROGRESS_INTERVAL_MS": "1000", "VOICY_WORKER_LEASE_TTL_MS": "5000",
            "CAIRN_NATS_URL": self.nats.url, "CAIRN_PROVIDER": "strava", "CAIRN_WORKER_NAME": "strava-fetcher",
            "CAIRN_STRAVA_BASE_URL": self.strava.base_url,
            "FLOWER_USER": "demo", "FLOWER_PASSWORD": self.flower_password,
            "IO_CONCURRENCY": "2", "PROVIDER_CONCURRENCY": "4", "PATH": f"{Path(sys.executable).parent}:"
            + os.environ.get("PATH", ""),
        })
        self.env.update(demo_webhook.fleet_env())  # the webhook leg (deploy/demo_webhook.py)
        self.fleet: Proc | None = None
        self.jobs: dict[str, dict] = {}
        self.account_id = ""

    def start_fleet(self) -> None:
        print(f"starting the Procfile fleet with honcho (log: {self.tmp / 'fleet.log'})")
        self.fleet = spawn([sys.executable, "-m", "honcho", "start", "-f", str(ROOT / "Procfile"),
                            "-p", str(FLOWER_PORT)], self.env, self.tmp / "fleet.log",
                           stop_timeout_s=FLEET_STOP_TIMEOUT_S)
        print(f"Flower: http://127.0.0.1:{FLOWER_PORT}  (user demo, password {self.flower_password})")

    def enqueue(self) -> None:
        for item in _fixtures(self.short):
            data = (ROOT / "tests" / "fixtures" / "audio" / item["file"]).read_bytes()
            self.telegram.add_file(f"demo-{item['name']}", data)
            job_id = self.voicy.enqueue_job(f"demo-{item['name']}", file_size=len(data))
            self.jobs[job_id] = item
        n = SHORT_ACTIVITIES if self.short else FULL_ACTIVITIES
        athlete = self.strava.add_athlete(ATHLETE_ID, n_activities=n)
        account = self.core.connect_account("strava", None, athlete.access_token, athlete.refresh_token,
                                            athlete.expires_at, worker_name="strava-fetcher",
                                            external_id=ATHLETE_ID, client_id=self.strava.client_id,
                                            client_secret=getattr(self.strava, "client_secret", ""))
        self.account_id = account.account_id
        self.expected_activities = n
        self.core.schedule_reconcile(self.account_id)
        print(f"enqueued {len(self.jobs)} voice messages and connected a Strava athlete with {n} activities")

    # --- live view -------------------------------------------------------------------------------
    def _bars(self) -> list[str]:
        rows = []
        for job_id, item in self.jobs.items():
            job = self.voicy.get_job(job_id)
            parts = job.get("resultParts") or job.get("partialResultParts") or []
            done = job["status"] == "completed"
            heard = 1.0 if done else _seconds(parts[-1]["timeCode"]) / max(item["duration_s"], 1) if parts else 0.0
            fill = int(BAR_WIDTH * min(heard, 1.0))
            rows.append(f"  {item['name']:<8} [{'#' * fill}{'.' * (BAR_WIDTH - fill)}] {job['status']}")
        return rows

    def _activities(self) -> list:
        return [r for r in self.core.ingested if r.kind == "events"]

    def _cairn_line(self) -> str:
        jobs = len(self.core.published_jobs) if hasattr(self.core, "published_jobs") else 0
        return (f"  cairn: jobs published {jobs}, results ingested {len(self.core.ingested)}, "
                f"activity results {len(self._activities())}/{self.expected_activities}, "
                f"rejected {len(self.core.rejected)}")

    def done(self) -> bool:
        voicy = all(self.voicy.get_job(j)["status"] in ("completed", "failed") for j in self.jobs)
        return voicy and len(self._activities()) >= self.expected_activities

    def watch(self, timeout_s: float) -> bool:
        tty = sys.stdout.isatty()
        deadline = time.monotonic() + timeout_s
        last_print = 0.0
        lines = 0
        while time.monotonic() < deadline:
            if self.fleet is not None and self.fleet.proc.poll() is not None:
                print("the fleet exited early; see fleet.log")
                return False
            rows = self._bars() + [self._cairn_line()]
            if tty:
                sys.stdout.write(("\x1b[F" * lines) + "\n".join(r + "\x1b[K" for r in rows) + "\n")
                sys.stdout.flush()
                lines = len(rows)
            elif time.monotonic() - last_print > 5:
                print("\n".join(rows), flush=True)
                last_print = time.monotonic()
            if self.done():
                if not tty:
                    print("\n".join(rows))
                return True
            time.sleep(REFRESH_S)
        return False

    def summary(self) -> int:
        print("\n== transcripts ==")
        completed = 0
        for job_id, item in self.jobs.items():
            job = self.voicy.get_job(job_id)
            completed += job["status"] == "completed"
            print(f"[{item['name']}] {job['status']}: {job.get('resultText', job.get('lastError', ''))}")
        acts = self._activities()
        print("\n== imported activities ==")
        for r in acts[:25]:
            for ev in r.data.get("events", []):
                if "activity" in ev:
                    p = ev["activity"].get("payload", {})
                    print(f"  {p.get('startTime', '?')}  {p.get('type', '?'):<22} {p.get('title', '')}")
        ok = completed == len(self.jobs) and len(acts) >= self.expected_activities
        print(f"\nSUMMARY voicy_completed={completed}/{len(self.jobs)} "
              f"cairn_activities={len(acts)}/{self.expected_activities} "
              f"cairn_rejected={len(self.core.rejected)} status={'ok' if ok else 'incomplete'}")
        return 0 if ok else 1

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        for stop in (self.core.stop, self.strava.stop, self.telegram.stop, self.voicy.stop,
                     lambda: services.stop_moto(self.s3), self.nats.stop, self.redis.stop):
            try:
                stop()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


def _seconds(time_code: str) -> float:
    minutes, _, secs = time_code.partition(":")
    return int(minutes) * 60 + int(secs or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.demo", description=__doc__)
    parser.add_argument("--short", action="store_true", help="a few jobs only (used by the tests)")
    parser.add_argument("--serve", action="store_true", help="keep the stack up after the run")
    parser.add_argument("--timeout", type=float, default=DEMO_TIMEOUT_S)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="switchyard-demo-") as tmp:
        demo = Demo(args.short, Path(tmp))
        try:
            demo.start_fleet()
            demo.enqueue()
            demo.watch(args.timeout)
            code = demo.summary()
            code = max(code, demo_webhook.run(demo.core, demo.strava, ATHLETE_ID, "strava-fetcher"))
            if args.serve:
                print("serving; press Ctrl-C to stop")
                try:
                    signal.pause()
                except KeyboardInterrupt:
                    pass
            return code
        finally:
            demo.close()


if __name__ == "__main__":
    sys.exit(main())
