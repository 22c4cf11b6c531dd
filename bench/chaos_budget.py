"""The chaos run's log budget (H1): what a run of SIGKILLs and service restarts is *expected* to log.

``python -m bench chaos`` ends, like every run that starts the fleet, by reading
every dyno's log (``devstack.infra.log_budget``). A chaos run provokes faults
on purpose, so the outage and recovery lines they cause are allowed here, each
with its reason and the fault that provokes it; anything else (a traceback, a
process complaining about something no fault explains) is a finding, counted in
the figures and failing the run's targets, like a lost job. A line that shows up
here without a fault to explain it belongs in a fix, not in this list.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from devstack.infra import log_budget
from devstack.infra.log_budget import Allow, Budget

SHOWN_FINDINGS = 20  # the figures keep this many unexplained lines (the report prints them all)
REDIS_RESTART = "python -m bench chaos: the Redis restart of the window"
NATS_RESTART = "python -m bench chaos: the NATS restart of the window"
KILLS = "python -m bench chaos: the SIGKILLs of the window"

# The exceptions a NATS restart raises, as the fleet names them in a warning (never AttributeError & co:
# those are bugs, like the presence write of issue 14).
_NATS_AWAY = r"(?:TimeoutError|NatsUnavailableError|ConnectionClosedError|NoServersError|UnexpectedEOF" \
             r"|ConnectionRefusedError|OutboundBufferLimitError|StaleConnectionError)\b"

ALLOW: tuple[Allow, ...] = (
    # --- Redis restarted (R1: each long-running process logs the outage once, and its end)
    Allow(r"Redis unavailable( at REDIS_URL)? \(", reason="Redis is away: the outage, logged once per process "
          "(bridges, beat; workers.outage)", provoked_by=REDIS_RESTART),
    Allow(r"Redis available again after", reason="the end of that outage", provoked_by=REDIS_RESTART),
    Allow(r"consumer: Connection to broker lost\. Trying to re-establish the connection",
          reason="a Celery worker's broker connection dropped with Redis", provoked_by=REDIS_RESTART),
    Allow(r"consumer: Cannot connect to \S+: Error 111 connecting to",
          reason="Celery logs each reconnect attempt at ERROR while Redis is down (docs/operations.md §7)",
          provoked_by=REDIS_RESTART),
    Allow(r"message \S+ not acked: the broker connection dropped \(\w+\)",
          reason="a task started as Redis went away: its early ack failed, its job's recovery runs it "
          "(tasks/hardening/lost_acks.py)", provoked_by=REDIS_RESTART),
    Allow(r"Connection to Redis lost: Retry \(\d+/\d+\)", reason="Celery's result backend reconnecting",
          provoked_by=REDIS_RESTART),
    Allow(r"lease renewal for job \S+ failed \(\w+\); retrying|lease of job \S+ re-taken after a Redis outage",
          reason="a running job's lease could not be renewed while Redis was away, then is set back",
          provoked_by=REDIS_RESTART),
    Allow(r"job \S+: Redis unreachable \(\w+\) when taking its lease; waiting up to",
          reason="a task started as Redis went away: it waits for Redis to take its job instead of stranding "
          "the grant (tests/voicy/test_lease.py)", provoked_by=REDIS_RESTART),
    Allow(r"Redis unavailable: recording the outcome of|outcome of \S+ recorded after Redis came back",
          reason="a job finished during the outage: its outcome is recorded once Redis answers",
          provoked_by=REDIS_RESTART),
    Allow(r"job \w+: result posted; its records wait for Redis",
          reason="a transcription's result landed just before the outage: its cleanup is left to the reaper",
          provoked_by=REDIS_RESTART),
    Allow(r"job \w+: Redis unavailable \(\w+.*\); left for the reaper",
          reason="a Voicy task met the outage mid-job: no failure posted, its lease expires and the reaper "
          "recovers the job", provoked_by=f"{REDIS_RESTART}; tests/voicy/test_voicy_recovery.py::"
          "test_redis_lost_mid_download_fails_neither_the_job_nor_the_task"),
    Allow(r"could not record the claim; handed it back to Voicy",
          reason="Redis failed as the bridge recorded a claim: the job went back to Voicy", provoked_by=REDIS_RESTART),
    Allow(r"job \S+: could not undo a failed adoption: \w+",
          reason="Redis still failed as the bridge undid that record: what the write left ends with the job's next "
          "claim or the reaper", provoked_by=f"{REDIS_RESTART}; python -m bench partitions: voicy-bridge-redis; "
          "tests/voicy/test_voicy_recovery.py::test_a_claim_whose_record_cannot_be_undone_either_goes_back_and_"
          "holds_one_slot"),
    # --- NATS restarted
    Allow(r"NATS unavailable \(", reason="NATS is away: the outage, logged once per process", provoked_by=NATS_RESTART),
    Allow(r"NATS available again after", reason="the end of that outage", provoked_by=NATS_RESTART),
    Allow(r"presence write failed \(" + _NATS_AWAY, reason="a provider worker's presence write met the restart; "
          "the next interval writes it", provoked_by=NATS_RESTART),
    Allow(r"for seq \d+ not sent \((?:NotSentError|NoRespondersError)\); its redelivery applies the recorded outcome",
          reason="an ack while NATS was away, or back without JetStream answering yet (no responders): the "
          "redelivery is settled from the ledger", provoked_by=NATS_RESTART),
    # --- processes SIGKILLed
    Allow(r"Process 'ForkPoolWorker-\d+' pid:\d+ exited with 'signal 9 \(SIGKILL\)'",
          reason="a pool child was SIGKILLed; Celery's parent reports it", provoked_by=KILLS),
    Allow(r"WorkerLostError\('Worker exited prematurely: signal 9 \(SIGKILL\)",
          reason="the task the SIGKILLed child ran: the job's lease takes it from there", provoked_by=KILLS),
    Allow(r"job \w+: worker lost; redispatching transcription",
          reason="the reaper recovers the job of a killed gpu process (or one whose records waited for Redis)",
          provoked_by=KILLS),
    Allow(r"job \w+ failed \(retryable=True\): worker lost before the media was stored",
          reason="the reaper hands a job back to Voicy (which requeues it) when its io process died, or its "
          "records waited for Redis, before its media was stored", provoked_by=f"{KILLS}; {REDIS_RESTART}"),
    Allow(r"job \w+: grant stranded \(its task's message out of every queue for \d+s, ",
          reason="a worker's main process took a task's message and was killed, or lost Redis, before its pool "
          "started it (kombu keeps it unacked for 12 h): the reaper's grant audit recovers the job "
          "(workers/voicy/grants.py)", provoked_by=f"{KILLS}; {REDIS_RESTART}; tests/voicy/test_voicy_stranded.py"),
    Allow(r"job \w+: redispatching transcription",
          reason="that stranded job's media was stored: its transcription is sent again",
          provoked_by=f"{KILLS}; {REDIS_RESTART}; tests/voicy/test_voicy_stranded.py"),
    Allow(r"job \w+ failed \(retryable=True\): task lost by the broker before any worker ran it",
          reason="that stranded job had no media yet: handed back to Voicy, which requeues it",
          provoked_by=f"{KILLS}; {REDIS_RESTART}; tests/voicy/test_voicy_stranded.py"),
    Allow(r"job \w+: Voicy never recorded /downloaded; completing the handshake",
          reason="an io process killed between storing the media and POST /downloaded", provoked_by=KILLS),
)


def scan(logs: Iterable[Path]) -> Budget:
    """Every dyno's log against the baseline and the chaos entries."""
    return log_budget.scan(logs, [*log_budget.baseline(), *ALLOW])


def figures(budget: Budget) -> dict[str, Any]:
    """The budget as figures: how many lines no entry explains (a target: 0), the first of them,
    and how often each entry was used."""
    return {"unexplained": len(budget.unexplained),
            "lines": [f.line() for f in budget.unexplained[:SHOWN_FINDINGS]],
            "allowed": dict(budget.allowed)}
