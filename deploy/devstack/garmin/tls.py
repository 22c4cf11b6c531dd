"""A throwaway certificate authority and a server certificate for the fake Garmin's real host names.

Why real names and real TLS: garth only speaks ``https://<sub>.<domain>`` and
fetches its OAuth consumer from ``https://thegarth.s3.amazonaws.com``; the
pool reaches the fake through a CONNECT proxy (``proxy.py``) exactly as it
would reach Garmin through a corporate proxy, so the TLS handshake must
succeed for those names. The pool trusts the CA through
``CAIRN_GARMIN_CA_BUNDLE``; nothing on the system is touched. Keys are made
fresh per fake (EC P-256, fast) and live in the fake's temporary directory.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CERT_LIFETIME = datetime.timedelta(days=2)
CLOCK_SKEW = datetime.timedelta(hours=1)


@dataclasses.dataclass(frozen=True)
class CertFiles:
    ca_bundle: Path  # trust this (CAIRN_GARMIN_CA_BUNDLE)
    certfile: Path  # the server's chain
    keyfile: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def issue(directory: Path, hosts: list[str]) -> CertFiles:
    """A CA and a leaf certificate for ``hosts``, written under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("Switchyard fake Garmin CA"))
               .issuer_name(_name("Switchyard fake Garmin CA")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CERT_LIFETIME)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CERT_LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = CertFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca_bundle.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.keyfile.write_bytes(_pem(key))
    files.keyfile.chmod(0o600)
    return files
