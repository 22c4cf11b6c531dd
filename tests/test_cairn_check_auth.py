"""``switchyard check cairn`` against a NATS that requires a login, as every production core does.

The pool (bridge + provider worker) logs in with ``CAIRN_NATS_USER`` /
``CAIRN_NATS_PASSWORD``; the checker runs as its own process with the pool's
environment and no option at all (issue 14 §5: it used to ignore
``CAIRN_NATS_URL`` and had no credentials, so the documented check after an
upgrade could not connect). Options override the variables, and any credential
option replaces every credential variable. Permissions are not this test's
subject: both users may do everything (core's worker template is tested with
the pool itself).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.devstack import services
from deploy.devstack.cairn_core import DevCairnCore
from deploy.devstack.strava import FakeStrava
from tests.cairn_stack import PROVIDER, ROOT, WAIT_S, CairnStack
from tests.conftest import wait_until
from tests.gate import GateMiddleware

pytestmark = pytest.mark.slow

CHECK_TIMEOUT_S = "15"
CHECK_GUARD_S = 120
CORE_USER, POOL_USER = "core", "pool"
CREDENTIAL_VARIABLES = ("CAIRN_NATS_USER", "CAIRN_NATS_PASSWORD", "CAIRN_NATS_CREDS", "CAIRN_WORKER_ENROLLMENT_TOKEN")


def start_nats_with_login(workdir: Path, passwords: dict[str, str]) -> services.Service:
    """nats-server with JetStream that refuses anonymous clients: one user per entry of ``passwords``."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = services.free_port()
    users = ", ".join(f'{{user: "{user}", password: "{password}"}}' for user, password in passwords.items())
    conf = workdir / "nats.conf"
    conf.write_text(f'listen: "127.0.0.1:{port}"\nserver_name: "sy-login-{port}"\n'
                    f'jetstream {{ store_dir: "{workdir / "js"}" }}\n'
                    f"authorization {{ users: [{users}] }}\n")
    argv = [services.find_binary("nats-server"), "-c", str(conf)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    services.wait_for_port(port, proc)
    return services.Service("nats", f"nats://127.0.0.1:{port}", port, proc, workdir, {"argv": argv})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    tmp = tmp_path_factory.mktemp("cairn-check-auth")
    passwords = {CORE_USER: secrets.token_hex(8), POOL_USER: secrets.token_hex(8)}
    s = CairnStack(tmp, redis_url, s3_endpoint)
    try:
        s.nats = start_nats_with_login(tmp / "nats", passwords)
        core_url = s.nats.url.replace("nats://", f"nats://{CORE_USER}:{passwords[CORE_USER]}@")
        s.core = DevCairnCore(core_url, s3_endpoint, bucket=f"cairn-{s.pool}").start()
        s.strava = FakeStrava()
        s.strava.app.add_middleware(GateMiddleware, gate=s.gate)
        s.strava.start()
        s.extra_env = {"CAIRN_NATS_USER": POOL_USER, "CAIRN_NATS_PASSWORD": passwords[POOL_USER]}
        s.start_worker()
        s.start_bridge()
        wait_until(lambda: s.core.live_presence(s.pool), WAIT_S, "the pool's presence")  # type: ignore[union-attr]
        yield s
    finally:
        s.stop()


def run_check(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """``switchyard check cairn`` as an operator runs it on a fleet host: the host's environment."""
    return subprocess.run([sys.executable, "-m", "ops", "check", "cairn", "--timeout", CHECK_TIMEOUT_S, *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHECK_GUARD_S)


def test_the_check_connects_with_the_pools_own_settings_and_no_option(stack: CairnStack) -> None:
    out = run_check(stack.env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("presence heartbeat", f"consumer for cairn.jobs.fetch_source.{PROVIDER}.{stack.pool}",
                 "discover request/reply"):
        assert f"PASS  {name}" in lines, out.stdout
    assert lines[-1] == "worker is contract-compliant"


def test_without_credentials_the_check_says_nats_refused_them(stack: CairnStack) -> None:
    env = {k: v for k, v in stack.env.items() if k not in CREDENTIAL_VARIABLES}
    out = run_check(env)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stdout.splitlines()
    assert line.startswith(f"cannot connect to {stack.nats.url}: ")  # type: ignore[union-attr]
    assert "NATS refused the credentials" in line and "CAIRN_NATS_USER" in line, line


def test_options_override_the_variables(stack: CairnStack) -> None:
    """A wrong password and a dead URL in the environment lose to --nats/--user/--password."""
    env = stack.env | {"CAIRN_NATS_URL": f"nats://127.0.0.1:{services.free_port()}",
                       "CAIRN_NATS_PASSWORD": f"wrong-{uuid.uuid4().hex}"}
    right = stack.env["CAIRN_NATS_PASSWORD"]
    out = run_check(env, "--nats", stack.nats.url, "--user", POOL_USER, "--password", right)  # type: ignore[union-attr]
    assert out.returncode == 0, out.stdout + out.stderr
    assert right not in out.stdout + out.stderr


def test_a_credential_option_replaces_every_credential_variable(stack: CairnStack) -> None:
    """--enrollment-token is the only credential sent: the pool's user/password from the environment would
    have logged in, the token alone is refused by a server without core's auth callout."""
    token = f"enroll-{uuid.uuid4().hex}"
    out = run_check(stack.env, "--enrollment-token", token)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "NATS refused the credentials" in out.stdout
    assert token not in out.stdout + out.stderr and stack.env["CAIRN_NATS_PASSWORD"] not in out.stdout


def test_a_bad_variable_is_one_line_naming_it(stack: CairnStack) -> None:
    out = run_check(stack.env | {"CAIRN_NATS_URL": "http://127.0.0.1:1"})
    assert out.returncode == 2
    assert out.stderr.strip() == ("switchyard check cairn: invalid configuration: CAIRN_NATS_URL: "
                                  "Value error, must be a nats:// URL"), out.stderr

