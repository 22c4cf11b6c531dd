"""``switchyard strava webhook subscribe|show|delete``: the app's Strava push subscription."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
from typing import Any, TextIO

import httpx

from workers.logs import redact, register_secret

DEFAULT_BASE_URL = "https://www.strava.com"
SUBSCRIPTIONS_PATH = "/api/v3/push_subscriptions"  # one push subscription per Strava application
HTTP_TIMEOUT_S = 30.0  # the create waits for Strava's own callback round trip
ENV_CLIENT_ID = "STRAVA_CLIENT_ID"
ENV_CLIENT_SECRET = "STRAVA_CLIENT_SECRET"
ENV_VERIFY_TOKEN = "CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN"
ENV_BASE_URL = "CAIRN_STRAVA_BASE_URL"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
ERROR_BODY_MAX_CHARS = 300


def register(verbs: Any) -> None:
    """Register ``strava webhook …`` on the top-level subparsers of ``switchyard``."""
    strava = verbs.add_parser("strava", help="Strava app administration")
    strava_sub = strava.add_subparsers(dest="strava_command", required=True)
    webhook = strava_sub.add_parser("webhook", help="the app's push subscription (webhooks)")
    leaves = webhook.add_subparsers(dest="verb", required=True)
    subscribe = leaves.add_parser("subscribe", help="create the subscription (Strava validates the callback)")
    subscribe.add_argument("--callback-url", required=True,
                           help="core's public https://<instance>/webhooks/<worker_name>-strava")
    leaves.add_parser("show", help="show the app's subscription")
    delete = leaves.add_parser("delete", help="delete the app's subscription")
    delete.add_argument("--id", type=int, default=None, help="subscription id (default: the app's one)")
    for leaf in (subscribe, delete, leaves.choices["show"]):
        leaf.add_argument("--base-url", default=None, help=f"Strava base URL (default ${ENV_BASE_URL} or "
                          f"{DEFAULT_BASE_URL})")
        leaf.set_defaults(run=run)


def _credentials() -> tuple[str, str]:
    """The app's client id and secret from the environment or a prompt (the secret without echo); never printed."""
    client_id = os.environ.get(ENV_CLIENT_ID, "").strip() or input("Strava client id: ").strip()
    secret = os.environ.get(ENV_CLIENT_SECRET, "").strip() or getpass.getpass("Strava client secret: ").strip()
    register_secret(secret)
    return client_id, secret


def _verify_token() -> str:
    """The token Strava sends back in its ``hub.challenge`` call: the pool echoes the challenge only when its
    ``CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN`` equals it."""
    token = os.environ.get(ENV_VERIFY_TOKEN, "").strip() or getpass.getpass(
        "verify token (the pool's CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN): ").strip()
    register_secret(token)
    return token


def _error(resp: httpx.Response) -> str:
    return f"HTTP {resp.status_code}: {redact(resp.text[:ERROR_BODY_MAX_CHARS])}"


def _find(client: httpx.Client, url: str, creds: dict[str, str]) -> list[dict[str, Any]]:
    resp = client.get(url, params=creds)
    if resp.status_code != 200:
        raise RuntimeError(_error(resp))
    body = resp.json()
    return body if isinstance(body, list) else []


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one leaf verb. Strava takes the secret in the query string of ``show``/``delete``, so httpx's request
    logging is silenced and an HTTP error is reported by its type only."""
    out = out or sys.stdout  # looked up per call (a redirected stdout is honoured)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # request URLs carry the secret (show/delete)
    base = (args.base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL).rstrip("/")
    url = base + SUBSCRIPTIONS_PATH
    client_id, secret = _credentials()
    if not client_id or not secret:
        print("a client id and a client secret are required", file=out)
        return EXIT_USAGE
    creds = {"client_id": client_id, "client_secret": secret}
    try:
        with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
            return _run_verb(args, client, url, creds, out)
    except httpx.HTTPError as exc:
        print(f"Strava did not answer: {type(exc).__name__}", file=out)
        return EXIT_FAILED
    except RuntimeError as exc:
        print(f"Strava refused: {redact(str(exc))}", file=out)
        return EXIT_FAILED


def _run_verb(args: argparse.Namespace, client: httpx.Client, url: str, creds: dict[str, str],
              out: TextIO) -> int:
    if args.verb == "subscribe":
        token = _verify_token()
        if not token:
            print("a verify token is required", file=out)
            return EXIT_USAGE
        resp = client.post(url, data=creds | {"callback_url": args.callback_url, "verify_token": token})
        if resp.status_code not in (200, 201):
            raise RuntimeError(_error(resp))
        print(f"subscribed: id {resp.json().get('id')} → {args.callback_url}", file=out)
        return EXIT_OK
    subs = _find(client, url, creds)
    if args.verb == "show":
        if not subs:
            print("no push subscription for this app", file=out)
        for sub in subs:
            print(f"id {sub.get('id')}  callback {sub.get('callback_url')}  created {sub.get('created_at')}",
                  file=out)
        return EXIT_OK
    sub_id = args.id if args.id is not None else (subs[0].get("id") if subs else None)
    if sub_id is None:
        print("no push subscription to delete", file=out)
        return EXIT_FAILED
    resp = client.delete(f"{url}/{int(sub_id)}", params=creds)
    if resp.status_code not in (200, 204):
        raise RuntimeError(_error(resp))
    print(f"deleted subscription {sub_id}", file=out)
    return EXIT_OK
