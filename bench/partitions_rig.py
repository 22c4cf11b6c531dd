"""The partition harness's world: the chaos rig's stack and Procfile fleet, spread over hosts (R2).

Hosts are network namespaces of one machine (``devstack/netsim/hosts.py``), each
with its own hostname, pid numbering, ``/tmp`` and address on one switch:

=========  ===================================================================
host       runs
=========  ===================================================================
core       Redis (AOF), NATS (JetStream), S3 (moto), the dev Voicy Worker API,
           the dev Cairn core, and the external fakes (Telegram, Strava); this
           harness process itself moves onto core to run them and to count
gpu1/gpu2  one ``gpu`` dyno each (the Procfile's line is ``-c 1``)
io         the ``io`` dyno
provider   the ``provider`` dyno
vbridge    the Voicy bridge; cbridge: the Cairn bridge; beat: Celery beat
=========  ===================================================================

The bridges and beat have hosts of their own so that each can be cut from one
service without cutting anything else. The only storage two hosts share is S3:
the Voicy media store is ``s3://`` on core (an io host downloads, a gpu host
reads), each host's work directory is its own ``/tmp``, and the repository is
read-only on every host. Only the Voicy hosts get the media store's S3
credentials; the Cairn hosts have none (S2: they reach S3 by presigned URLs).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from bench.chaos_rig import ChaosRig, formation
from devstack.infra import services, tls
from devstack.infra.procfile import entries as procfile_entries
from devstack.infra.stack import ROOT
from devstack.netsim.hosts import Host, Network, sweep_stale

CORE = "core"
# Dyno kind -> its hosts, one dyno per host in order (``formation`` decides how many there are).
PLACEMENT: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu1", "gpu2"), "io": ("io",), "provider": ("provider",),
    "voicy_bridge": ("vbridge",), "cairn_bridge": ("cbridge",), "beat": ("beat",),
}
HOST_NAMES = [CORE, *dict.fromkeys(h for hosts in PLACEMENT.values() for h in hosts)]
VOICY_HOSTS = frozenset({"gpu1", "gpu2", "io", "vbridge", "beat"})  # the media store's users
MEDIA_BUCKET = "sy-media"
MEDIA_PREFIX = "voicy"
S3_KEY_ID, S3_SECRET = "sy-hosts-key", "sy-hosts-secret"  # moto accepts any; real S3 would not
HOST_WORK_DIR = "/tmp/work"  # on the host's own /tmp
HOST_CA = Path("/tmp/ca.pem")  # each host's trust store for the dev stack's https fakes
HOST_ENV = {"VOICY_WORKER_WORK_DIR": HOST_WORK_DIR, "HOME": "/tmp/home", "TMPDIR": "/tmp",
            "SSL_CERT_FILE": str(HOST_CA)}
S3_ENV_PREFIXES = ("AWS_", "VOICY_WORKER_S3_", "VOICY_WORKER_MEDIA_STORE")


class PlacementError(RuntimeError):
    """A Procfile process type that no host runs (add it to ``PLACEMENT``)."""


@dataclass
class HostsRig(ChaosRig):
    """``ChaosRig`` with every dyno on a host of its own kind and the services on core."""

    net: Network | None = None

    def start(self) -> HostsRig:
        sweep_stale()
        self.net = Network().create(HOST_NAMES, self.workdir / "hosts")
        self.net.enter(CORE)
        services.set_listen_host(self.host(CORE).address)
        self.start_services()
        self._make_bucket()
        procfile = procfile_entries(ROOT / "Procfile")
        # The chaos rig's one pool (Strava): another pool's lines (garmin) have no host here.
        self.start_fleet(place=self.place, dynos={k: n for k, n in formation(procfile).items() if k in PLACEMENT})
        return self

    def host(self, name: str) -> Host:
        assert self.net is not None, "not started"
        return self.net.hosts[name]

    def host_of(self, dyno: str) -> Host:
        """The host a dyno (``gpu.2``) runs on."""
        kind, _, index = dyno.rpartition(".")
        hosts = PLACEMENT.get(kind, ())
        if not hosts or int(index) > len(hosts):
            raise PlacementError(f"no host runs dyno {dyno} (bench/partitions_rig.py PLACEMENT)")
        return self.host(hosts[int(index) - 1])

    def host_by_address(self, address: str | None) -> str | None:
        assert self.net is not None
        return next((h.name for h in self.net.hosts.values() if h.address == address), None)

    def place(self, dyno: str, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        host = self.host_of(dyno)
        env = env | HOST_ENV
        if host.name not in VOICY_HOSTS:
            env = {k: v for k, v in env.items() if not k.startswith(S3_ENV_PREFIXES)}
        return host.argv(argv), env

    def _strava_tls(self) -> tuple[Path, Path] | None:
        """Strava is an https API on another machine: its fake gets a certificate for core's address,
        and every host trusts the CA (``HOST_CA``, copied onto each host's own disk)."""
        self.certs = tls.issue(self.workdir / "tls", [self.host(CORE).address])
        assert self.net is not None
        for host in self.net.hosts.values():
            shutil.copyfile(self.certs.ca_bundle, host.disk / HOST_CA.name)
        return self.certs.certfile, self.certs.keyfile

    def _fleet_env(self, token: str) -> dict[str, str]:
        env = super()._fleet_env(token)
        env.update({"VOICY_WORKER_MEDIA_STORE": f"s3://{MEDIA_BUCKET}/{MEDIA_PREFIX}",
                    "VOICY_WORKER_S3_ENDPOINT_URL": self.s3_endpoint, "AWS_ACCESS_KEY_ID": S3_KEY_ID,
                    "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1"})
        return env

    def _make_bucket(self) -> None:
        self.s3().create_bucket(Bucket=MEDIA_BUCKET)

    def s3(self) -> Any:
        return boto3.client("s3", endpoint_url=self.s3_endpoint, aws_access_key_id=S3_KEY_ID,
                            aws_secret_access_key=S3_SECRET, region_name="us-east-1")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.net is not None:
                self.net.destroy()
