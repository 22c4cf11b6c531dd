"""A throwaway certificate authority and one server certificate, for a fake served over TLS.

Why: an external API the pool reaches across hosts must be https (a plain-http
URL is allowed only on loopback: contract §1 for the manifest's authorize URL,
and the pool refuses anything else at start). The partition harness serves its
fake Strava on the core host's address with a certificate from here; the hosts
that call it trust the CA through ``SSL_CERT_FILE`` (httpx reads it). The fake
Garmin serves Garmin's own host names with one (garth speaks only https to
them; the pool trusts it through ``CAIRN_GARMIN_CA_BUNDLE``). Nothing on
the system is touched. Keys are EC P-256 (fast), made fresh per run.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_LIFETIME = datetime.timedelta(days=2)
CLOCK_SKEW = datetime.timedelta(hours=1)
CA_NAME = "Switchyard dev stack CA"


@dataclasses.dataclass(frozen=True)
class CertFiles:
    ca_bundle: Path  # what clients trust (SSL_CERT_FILE)
    certfile: Path  # the server's certificate
    keyfile: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def issue(directory: Path, addresses: list[str]) -> CertFiles:
    """A CA, and a certificate for ``addresses`` (IP addresses or host names) signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(CA_NAME)).issuer_name(_name(CA_NAME))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CERT_LIFETIME)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(addresses[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CERT_LIFETIME)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = CertFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca_bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    files.keyfile.chmod(0o600)
    return files
