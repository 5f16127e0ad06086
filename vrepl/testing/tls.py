"""Throwaway TLS material for tests: a self-signed CA and a server certificate it signs.

Owns: generating, with the `cryptography` package (a test dependency), a CA, a server key and
certificate naming 127.0.0.1 and localhost (IP and DNS subject alternative names, so a client
checking the host name accepts it), and a second key that matches nothing, all as PEM files
in a directory the caller gives. Must not: be imported by product code (vrepl never makes
certificates; operators bring theirs).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: str          # the CA certificate (what a client's --cacert names)
    cert: str        # the server certificate (http.tls_cert)
    key: str         # its private key (http.tls_key)
    other_key: str   # a key that does not match `cert`


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_tls_files(directory: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                   days: int = 2) -> TlsFiles:
    """A CA and a server certificate for `hosts`, valid from an hour ago for `days` days."""
    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vrepl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca=_write(os.path.join(directory, "ca.pem"), ca.public_bytes(pem)),
        cert=_write(os.path.join(directory, "cert.pem"), cert.public_bytes(pem)),
        key=_write(os.path.join(directory, "key.pem"), _key_pem(key)),
        other_key=_write(os.path.join(directory, "other-key.pem"),
                         _key_pem(ec.generate_private_key(ec.SECP256R1()))))
