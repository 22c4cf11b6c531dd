"""``make stack``: the embedded services up until Ctrl-C, and the ``.env`` a local ``honcho start`` reads."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from devstack.demo import Demo
from devstack.infra.cairn_stack import CA_OVERRIDES
from devstack.infra.services import free_port
from devstack.interrupts import signals_ignored, stop_on_ctrl_c, wait_for_ctrl_c

# The first line of every .env this writes: only such a file is overwritten, or deleted at the stop.
MARK = "# written by python -m devstack.serve (make stack); deleted when it stops"
DEFAULT_PORT = 5000  # honcho's own default: web (Flower) listens here, the other types ignore theirs
EXIT_REFUSED = 2
# Variables a process gets from honcho, its shell or the venv: never written to the file.
AMBIENT = ("PATH", "HONCHO_PROCESS_NAME")
GARMIN_CA = "CAIRN_GARMIN_CA_BUNDLE"  # the fake Garmin's CA (devstack/fakes/garmin/kit.py)
ALWAYS = ("PYTHONUNBUFFERED", "HF_HUB_OFFLINE")  # written even when the shell has them: the next one may not

DESCRIPTION = """\
Start the embedded services a local Procfile run needs (Redis, NATS JetStream, S3 (moto), the dev
Voicy Worker API, the dev Cairn core, fake Telegram, Strava and Garmin Connect, all on 127.0.0.1)
and write the .env that `honcho start` reads; keep them up until Ctrl-C, then delete the .env.

In another terminal, from the repository:  . .venv/bin/activate && honcho start"""


def say(text: str) -> None:
    print(text, flush=True)


def dotenv(env: dict[str, str], port: int) -> str:
    """The fleet's own variables (not the ambient ones it inherits), one ``KEY=value`` a line."""
    own = {k: v for k, v in env.items() if (os.environ.get(k) != v or k in ALWAYS) and k not in AMBIENT}
    own |= {"PORT": str(port), "FLOWER_ADDRESS": "127.0.0.1"}  # honcho's base port; Flower on loopback only
    # A shell's CA bundle would override the fake Garmin's CA inside garth, and the Garmin pool refuses
    # to start so; honcho drops an empty value, so they name the fake's CA, as that check allows.
    if env.get(GARMIN_CA):
        own |= dict.fromkeys(CA_OVERRIDES, env[GARMIN_CA])
    return "\n".join([MARK, *(f"{k}={v}" for k, v in sorted(own.items()))]) + "\n"


def ours(path: Path) -> bool:
    """Whether ``path`` is a .env this command wrote (the only kind it replaces or deletes)."""
    try:
        return path.read_text().startswith(MARK)
    except OSError:
        return False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m devstack.serve", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=Path, default=Path(".env"), metavar="FILE",
                   help="where to write the variables (default: %(default)s, which honcho reads); a file this "
                        "command did not write is never replaced")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="PORT in the file: honcho's base port, Flower's (default: %(default)s); 0 for a free "
                        "one, chosen with the stack's own ports so that none of its services takes it")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.env.exists() and not ours(args.env):
        say(f"{args.env} exists and was not written by this command: move it away or pass --env FILE")
        return EXIT_REFUSED
    stop_on_ctrl_c()
    tmp = Path(tempfile.mkdtemp(prefix="switchyard-stack-"))
    stack = Demo(short=True, tmp=tmp, log_dir=tmp / "logs")
    try:
        stack.start_stack()
        env, port = stack.fleet_env(), args.port or free_port()
        args.env.write_text(dotenv(env, port))
        args.env.chmod(0o600)  # it holds the dev stack's tokens
        say(f"wrote {args.env}; Flower will be on http://127.0.0.1:{port} (user {env['FLOWER_USER']}, "
            f"password {env['FLOWER_PASSWORD']})")
        say("now, in another terminal:  . .venv/bin/activate && honcho start")
        say("ready; press Ctrl-C to stop the services (stop honcho first)")
        wait_for_ctrl_c()
    except KeyboardInterrupt:
        say("\ninterrupted: stopping the services")
    finally:
        with signals_ignored():
            if ours(args.env):
                args.env.unlink()
            stack.close()
            shutil.rmtree(tmp, ignore_errors=True)
    return 0  # Ctrl-C is how it ends


if __name__ == "__main__":
    sys.exit(main())
