"""Session fixtures: real services on loopback, real Celery worker processes.

Nothing here mocks a component we own. Redis, nats-server and moto S3 run as
real servers on free ports (``devstack.infra.services``); Celery workers run
as real ``celery -A tasks worker`` processes so SIGKILL tests kill something real
(``tests.kit.celery_worker``).

Under pytest-xdist every worker is its own pytest session, so each gets its own
Redis, nats-server and moto S3 from these session fixtures: ``fresh_redis``
flushes only the calling worker's server. The shared fixtures and helpers live
in ``tests/kit/`` (see its ``__init__``); the kit modules that define fixtures
are registered here, once, as plugins.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.infra import log_budget as budget
from devstack.infra import services
from workers.logs import RedactingFilter

pytest_plugins = ["tests.kit.celery_worker", "tests.kit.cairn_ctx", "tests.kit.procfile", "tests.kit.fleet_guard",
                  "tests.kit.model_guard", "tests.kit.cpu_profile", "tests.kit.leak_hunt",
                  "tests.kit.socket_origin"]


@pytest.fixture(scope="session")
def redis_service() -> Iterator[services.Service]:
    with services.redis_server() as svc:
        yield svc


@pytest.fixture(scope="session")
def redis_url(redis_service: services.Service) -> str:
    return redis_service.url


@pytest.fixture(scope="session")
def nats_service() -> Iterator[services.Service]:
    with services.nats_server() as svc:
        yield svc


@pytest.fixture(scope="session")
def nats_url(nats_service: services.Service) -> str:
    return nats_service.url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with services.moto_s3() as svc:
        yield svc.url


@pytest.fixture()
def fresh_redis(redis_url: str) -> Iterator[str]:
    """The session Redis, flushed before the test so state never leaks between tests."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield redis_url
    client.close()


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs an entry point in-process (``switchyard doctor``/``health``) configures the
    root logger as a process does (``workers.logs.setup_logging``): its own handler, and the
    redaction filter on every handler present, pytest's own capture handlers included. That filter
    freezes each record (``exc_info`` rendered, redacted and cleared) for every handler after it, so
    left in place it took the tracebacks from a later test's ``caplog`` on the same xdist worker
    (test_outage after test_doctor). Put back what the test found."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if getattr(handler, "_switchyard", False) and handler not in handlers:
            root.removeHandler(handler)
        elif not getattr(handler, "_switchyard", False):
            handler.filters[:] = [f for f in handler.filters if not isinstance(f, RedactingFilter)]
    root.setLevel(level)


@pytest.fixture()
def http_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture everything, httpx and httpcore included, at DEBUG (S1 checks read this).

    Named explicitly because the fleet's logging setup quiets httpx: a secret check
    over a capture that never saw httpx's request lines would prove nothing.
    """
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


@pytest.fixture()
def log_budget(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[budget.Allow]]:
    """H1's log budget for a test that starts fleet processes logging under ``tmp_path``.

    After the test (and, used through ``pytest.mark.usefixtures`` or as the first
    argument, after the fixtures that stop its processes), every ``*.log`` under
    ``tmp_path`` is read: any WARNING, ERROR or traceback that neither the
    baseline, nor an entry of the module's ``LOG_BUDGET_ALLOW`` whose
    ``provoked_by`` names this test, nor an entry the test appended to the
    yielded list explains fails the test, naming the line. An entry applies only
    to the test that provokes it: the same line in another test is a finding.
    """
    test = request.node.originalname
    allow = [*budget.baseline(),
             *(e for e in getattr(request.module, "LOG_BUDGET_ALLOW", ()) if test in e.provoked_by.split())]
    yield allow
    budget.check([tmp_path], allow)


# The slow and model modules that took longest (wall, serially, tests/kit/cpu_profile.py on the shared box),
# longest first: handed out first, they do not end up as the run's tail. Only an order; a module
# missing here runs after these, in collection order.
LONGEST_FIRST = ("test_redis_restart", "test_voicy_shutdown", "test_engine_clips", "test_voicy_stranded",
                 "test_voicy_e2e", "test_engine_words", "test_voicy_batching", "test_engine_batched", "test_pools",
                 "test_cairn_shutdown",
                 "test_cairn_e2e", "test_voicy_grants", "test_presence_procfile", "test_nats_permissions", "test_demo",
                 "test_sentinel", "test_procfile", "test_procfile_stops", "test_cairn_outages", "test_health",
                 "test_voicy_recovery", "test_voicy_words", "test_hosts", "test_cairn_check_auth", "test_garmin_burst",
                 "test_garmin_logins", "test_local_procfile", "test_heals", "test_rolling_upgrade",
                 # the fast tier's longest (make check: 10-18 s each, mostly waits), ahead of its short ones
                 "test_cairn_publish_retry", "test_cairn_responders", "test_imports", "test_provider_strava",
                 "test_cairn_handlers", "test_docs_messages", "test_garmin_provider", "test_devstack_voicy")


def _module_rank(item: pytest.Item) -> int:
    name = item.path.stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow and model tests first (the longest modules of :data:`LONGEST_FIRST` ahead), then the rest
    (a stable sort: each module keeps its order). The model modules are CPU-bound and the slow ones
    mostly wait on fleet processes, so they are mixed at the start rather than left to the end.

    pytest-xdist (``--dist loadfile --no-loadscope-reorder``, see the Makefile) hands modules out in
    the order of their first test, one at a time to whichever worker is free: the long modules start
    early and the short ones fill the gaps at the end, instead of one worker picking up test_sentinel
    while the others have finished. Without xdist only the order changes; no test may depend on it.
    """
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None and item.get_closest_marker("model") is None,
                                 _module_rank(item)))
