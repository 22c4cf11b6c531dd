"""S3 side of the dev core: presigned URLs, key layout, claim-check fetch.

Core (reference §2.6) mints keys server-side, signs with SigV4 (boto3 signs
SigV2 unless told otherwise) and hands the uploader every signed header to
send verbatim. Workers hold no S3 credentials; only this module does.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from devstack.fakes.cairn_core.accounts import utcnow

PRESIGN_TTL_S = 15 * 60  # CAIRN_STORAGE_PRESIGN_TTL default
TRANSFER_EXPIRY_DAYS = 1  # lifecycle backstop for orphaned claim-check bodies
TRANSFER_RULE_ID = "cairn-transfer-expiry"
DEV_S3_KEY = "testing"  # moto accepts any credentials
DEV_S3_REGION = "us-east-1"


class PresignError(ValueError):
    """A refused presign request; the text goes back in ``Nats-Error`` (no secrets in it)."""


def rfc3339_ms(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def key_provider_ok(blob_id: str, provider: str, *, results: bool) -> bool:
    """True when ``blob_id`` sits under a layout of ``provider`` (any user)."""
    parts = blob_id.split("/")
    if len(parts) >= 3 and parts[0] in ("shared", "transfer") and parts[1] == provider and all(parts[2:]):
        return parts[0] == "shared" or results
    return len(parts) >= 4 and parts[0] == "users" and parts[2] == provider and all(parts[1:])


@dataclass
class BlobStore:
    """boto3 against the dev S3 endpoint (moto), one bucket."""

    endpoint: str
    bucket: str

    def __post_init__(self) -> None:
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=DEV_S3_REGION,
            aws_access_key_id=DEV_S3_KEY, aws_secret_access_key=DEV_S3_KEY,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))

    def ensure_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self.client.create_bucket(Bucket=self.bucket)
        self.client.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration={"Rules": [{
            "ID": TRANSFER_RULE_ID, "Filter": {"Prefix": "transfer/"}, "Status": "Enabled",
            "Expiration": {"Days": TRANSFER_EXPIRY_DAYS}}]})

    @staticmethod
    def mint_key(provider: str, kind: str, user_id: str, source_id: str) -> str:
        uid = uuid.uuid4()
        if kind == "result":
            return f"transfer/{provider}/{uid}.json"
        if user_id and source_id:
            return f"users/{user_id}/{provider}/sources/{source_id}/{uid}"
        if user_id:
            return f"users/{user_id}/{provider}/uploads/{uid}"
        return f"shared/{provider}/{uid}"

    def presign_upload(self, key: str, content_type: str, content_sha256: str) -> dict[str, Any]:
        if not content_type:
            raise PresignError("content_type required")
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "ContentType": content_type}
        checksum_b64 = None
        if content_sha256:
            try:
                digest = binascii.unhexlify(content_sha256)
            except (binascii.Error, ValueError):
                digest = b""
            if len(digest) != 32:
                raise PresignError("blob: content sha256 must be a hex-encoded sha-256 digest")
            checksum_b64 = base64.b64encode(digest).decode()
            params["ChecksumSHA256"] = checksum_b64
        url = self.client.generate_presigned_url("put_object", Params=params, ExpiresIn=PRESIGN_TTL_S)
        headers = {"Content-Type": content_type}
        if checksum_b64:
            headers["x-amz-checksum-sha256"] = checksum_b64
        signed = parse_qs(urlsplit(url).query).get("X-Amz-SignedHeaders", [""])[0].split(";")
        if "host" in signed:  # the SDK signs Host; core passes every signed header on
            headers["Host"] = urlsplit(url).netloc
        return {"method": "PUT", "url": url, "blob_id": key,
                "expires_at": rfc3339_ms(utcnow() + timedelta(seconds=PRESIGN_TTL_S)),
                "required_headers": headers}

    def presign_download(self, key: str) -> dict[str, Any]:
        url = self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": key},
                                                 ExpiresIn=PRESIGN_TTL_S)
        return {"method": "GET", "url": url, "blob_id": key,
                "expires_at": rfc3339_ms(utcnow() + timedelta(seconds=PRESIGN_TTL_S))}

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def put(self, key: str, body: bytes, content_type: str = "application/json") -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError:
            return False
        return True

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's ``ContentType`` and ``ContentLength``, or None when it does not exist."""
        try:
            meta = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError:
            return None
        return {"ContentType": meta.get("ContentType", ""), "ContentLength": meta.get("ContentLength", 0)}

    def keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (e.g. a user's ``users/<user>/<provider>/``), sorted."""
        found: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found += [obj["Key"] for obj in page.get("Contents", [])]
        return sorted(found)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)
