"""Real X.509 certificates for TLS tests (``cryptography``): a CA, server/client certs, bad ones.

    pki = make_pki(tmp_path)      # paths of PEM files
    pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key,
    pki.rogue_client_cert, pki.rogue_client_key (signed by another CA),
    pki.expired_server_cert, pki.expired_server_key (valid yesterday, not today)

Server certificates name ``localhost`` and ``127.0.0.1``.  EC P-256 keys (fast to make).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_client_cert: Path
    rogue_client_key: Path
    expired_server_cert: Path
    expired_server_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(cn: str):
    key, now = _key(), dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(cn: str, ca, *, server: bool, valid_days: tuple[int, int] = (-1, 30)):
    ca_cert, ca_key = ca
    key, now = _key(), dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now + dt.timedelta(days=valid_days[0]))
         .not_valid_after(now + dt.timedelta(days=valid_days[1]))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                               else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def _write(folder: Path, name: str, cert, key) -> tuple[Path, Path]:
    c, k = folder / f"{name}.crt", folder / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    k.chmod(0o600)
    return c, k


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca, rogue = _ca("graphfeed test CA"), _ca("rogue CA")
    ca_path, _ = _write(folder, "ca", *ca)
    server = _write(folder, "server", *_leaf("localhost", ca, server=True))
    client = _write(folder, "client", *_leaf("trainer", ca, server=False))
    rogue_client = _write(folder, "rogue-client", *_leaf("intruder", rogue, server=False))
    expired = _write(folder, "expired-server", *_leaf("localhost", ca, server=True, valid_days=(-10, -1)))
    return Pki(ca_path, *server, *client, *rogue_client, *expired)
