"""TLS for the stream service's TCP transport: the contexts, and a throwaway PKI for tests/demos.

The Ockam stream spec runs over Ockam routing, which leaves authentication to Ockam secure
channels; loglake speaks its Ockam TCP framing inside TLS instead (Python ``ssl``), so any TLS
terminator, certificate authority and client-certificate tooling works with it. TLS 1.3 is the
minimum on both sides. Mutual TLS: a server given ``client_ca`` requires a client certificate
signed by it, and the certificate's names become the peer's identity (``permissions.Peer``).

``write_test_pki`` makes a CA, a server certificate for 127.0.0.1/localhost and client
certificates with the ``cryptography`` package: for tests and the docs' examples, not for
production (keys are written unencrypted).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from loglake.errors import LocalProtocolError


class TlsConfigError(LocalProtocolError):
    """A certificate, key or CA file could not be loaded (its path and reason are the message)."""


def server_context(
    cert_file: str | Path, key_file: str | Path, client_ca: str | Path | None = None
) -> ssl.SSLContext:
    """The server's context: TLS 1.3 minimum; with ``client_ca``, a client certificate signed
    by it is required (a client without one fails the handshake)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
        if client_ca is not None:
            ctx.load_verify_locations(cafile=str(client_ca))
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        files = f"{cert_file}, {key_file}, {client_ca}"
        raise TlsConfigError(f"TLS server files ({files}): {e}") from None
    return ctx


def client_context(
    ca_file: str | Path | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
) -> ssl.SSLContext:
    """A client's context: TLS 1.3 minimum, the server's certificate checked against
    ``ca_file`` (else the system's CAs) and its host name; ``cert_file``/``key_file`` is the
    client certificate for mutual TLS."""
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        if cert_file is not None:
            ctx.load_cert_chain(str(cert_file), str(key_file) if key_file is not None else None)
        elif key_file is not None:
            raise TlsConfigError("a client key was given without its certificate")
    except (OSError, ssl.SSLError) as e:
        files = f"{ca_file}, {cert_file}, {key_file}"
        raise TlsConfigError(f"TLS client files ({files}): {e}") from None
    return ctx


@dataclass(frozen=True)
class TestPki:
    """Paths written by ``write_test_pki``: ``ca``, ``server_cert``/``server_key`` and, per
    client name, ``clients[name] = (cert, key)``."""

    __test__ = False  # not a pytest test class

    ca: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, tuple[Path, Path]]


def write_test_pki(
    folder: str | Path,
    clients: tuple[str, ...] = (),
    *,
    ca_name: str = "loglake test CA",
    days: int = 2,
) -> TestPki:
    """Write a CA, a server certificate for ``127.0.0.1``/``::1``/``localhost`` and one client
    certificate per name in ``clients`` (subject CN = the name, and a ``uri:`` SAN
    ``loglake://client/<name>``) into ``folder`` (ECDSA P-256 keys)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(
        stem: str, cert: x509.Certificate, k: ec.EllipticCurvePrivateKey
    ) -> tuple[Path, Path]:
        c, kp = out / f"{stem}.crt", out / f"{stem}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        kp.write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        kp.chmod(0o600)
        return c, kp

    ca_key = key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(name(ca_name))
        .issuer_name(name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(  # key_cert_sign, crl_sign
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, _ = write("ca", ca, ca_key)

    def leaf(
        cn: str, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        k = key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        return cert, k

    server, server_key = leaf(
        "localhost",
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ],
        ExtendedKeyUsageOID.SERVER_AUTH,
    )
    server_paths = write("server", server, server_key)
    client_paths = {}
    for cn in clients:
        cert, k = leaf(
            cn,
            [x509.UniformResourceIdentifier(f"loglake://client/{cn}")],
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        client_paths[cn] = write(f"client-{cn}", cert, k)
    return TestPki(ca_path, server_paths[0], server_paths[1], client_paths)
