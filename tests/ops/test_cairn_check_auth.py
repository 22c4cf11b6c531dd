"""``switchyard check cairn`` against a NATS that requires a login, as every production core does.

The dev stack's nats-server runs here without its anonymous convenience: the
pool logs in as its ``worker`` user (core's worker template, contract §1) and
core as ``core``; a client without credentials is refused. The checker runs as
its own process, as an operator runs it on a fleet host (issue 14 §5: it
ignored ``CAIRN_NATS_URL`` and had no credentials, so the documented check
after an upgrade could not even connect):

* with the pool's environment alone it connects as the pool, and says that the
  pool's login may not run the §10 checks (they need core's access);
* ``--user``/``--password`` (core's login) override the environment's, and the
  checks pass; ``--nats`` overrides ``CAIRN_NATS_URL``;
* any credential option replaces every credential variable;
* no credentials at all, or a bad variable, is one line and exit 2.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from devstack.infra import services
from tests.kit.cairn_stack import PROVIDER, ROOT, WAIT_S, CairnStack
from tests.kit.waiting import wait_until
from workers.cairn.settings import pool_variable

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cairn_check_auth")]  # one worker runs the module's stack

CHECK_TIMEOUT_S = "10"
CHECK_GUARD_S = 180
EXIT_COMPLIANT, EXIT_CANNOT_CHECK = 0, 2
CREDENTIAL_VARIABLES = ("CAIRN_NATS_USER", "CAIRN_NATS_PASSWORD", "CAIRN_NATS_CREDS", "CAIRN_WORKER_ENROLLMENT_TOKEN")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    s = CairnStack(tmp_path_factory.mktemp("cairn-check-auth"), redis_url, s3_endpoint, nats_anonymous=False)
    try:
        s.start()
        s.start_worker()
        s.start_bridge()
        wait_until(lambda: s.core.live_presence(s.pool), WAIT_S, "the pool's presence")
        yield s
    finally:
        s.stop()


def run_check(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """``switchyard check cairn`` with a fleet host's environment (``CAIRN_NATS_URL``, the pool's login)."""
    return subprocess.run([sys.executable, "-m", "ops", "check", "cairn", "--timeout", CHECK_TIMEOUT_S, *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHECK_GUARD_S)


def core_login(stack: CairnStack) -> list[str]:
    core = stack.nats_auth.core
    return ["--user", core.user, f"--password={core.password}"]  # a password may begin with "-"


def test_anonymous_clients_are_refused_here(stack: CairnStack) -> None:
    """The premise: nothing connects without a login (else the tests below prove nothing)."""
    env = {k: v for k, v in stack.env.items() if k not in CREDENTIAL_VARIABLES}
    out = run_check(env)
    assert out.returncode == EXIT_CANNOT_CHECK, out.stdout + out.stderr
    [line] = out.stdout.splitlines()
    url = stack.nats.url
    assert line.startswith(f"cannot connect to {url}: Error: nats: 'Authorization Violation'"), line
    assert "(NATS refused the credentials: set CAIRN_NATS_USER/CAIRN_NATS_PASSWORD" in line


def test_with_the_pools_settings_alone_it_logs_in_as_the_pool_and_says_the_checks_need_core(
        stack: CairnStack) -> None:
    out = run_check(stack.env)
    assert out.returncode == EXIT_CANNOT_CHECK, out.stdout + out.stderr
    assert "cannot connect" not in out.stdout  # CAIRN_NATS_URL and the pool's login were used
    assert out.stdout.splitlines()[-1].startswith("NATS refused this login "), out.stdout
    assert "the checks need core's NATS access, not the pool's" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert stack.env["CAIRN_NATS_PASSWORD"] not in out.stdout + out.stderr


def test_options_override_the_variables_and_core_s_login_passes(stack: CairnStack) -> None:
    """The environment's dead URL and the pool's logins (its CAIRN_POOL_<pool>_* ones too, which the settings
    apply over CAIRN_*) lose to --nats and core's --user/--password."""
    env = stack.env | {"CAIRN_NATS_URL": f"nats://127.0.0.1:{services.free_port()}",
                       pool_variable(stack.pool, "nats_user"): stack.env["CAIRN_NATS_USER"],
                       pool_variable(stack.pool, "nats_password"): f"wrong-{uuid.uuid4().hex}"}
    out = run_check(env, "--nats", stack.nats.url, *core_login(stack))
    assert out.returncode == EXIT_COMPLIANT, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("presence heartbeat", f"consumer for cairn.jobs.fetch_source.{PROVIDER}.{stack.pool}",
                 "discover request/reply"):
        assert f"PASS  {name}" in lines, out.stdout
    assert lines[-1] == "worker is contract-compliant"
    assert stack.nats_auth.core.password not in out.stdout + out.stderr


def test_a_credential_option_replaces_every_credential_variable(stack: CairnStack) -> None:
    """--enrollment-token alone is sent: the pool's user/password from the environment would have logged
    in, the token is refused by a server without core's auth callout."""
    token = f"enroll-{uuid.uuid4().hex}"
    out = run_check(stack.env, "--enrollment-token", token)
    assert out.returncode == EXIT_CANNOT_CHECK, out.stdout + out.stderr
    assert "Authorization Violation" in out.stdout and "NATS refused the credentials" in out.stdout
    assert token not in out.stdout + out.stderr


def test_a_bad_variable_is_one_line_naming_it(stack: CairnStack) -> None:
    out = run_check(stack.env | {"CAIRN_NATS_URL": "http://127.0.0.1:1"})
    assert out.returncode == EXIT_CANNOT_CHECK
    assert out.stderr.strip() == ("switchyard check cairn: invalid configuration: CAIRN_NATS_URL: "
                                  "Value error, must be a nats:// URL"), out.stderr
