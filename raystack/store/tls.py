"""Mutual TLS for a cluster (`tls: true`): its certificate authority, the node and client
certificates it signs, and the environment with which Ray's processes and clients use them.

$RAYSTACK_HOME/clusters/<name>/tls/      (0700, made fresh by every `raystack up`)
  ca.crt, ca.key       the cluster's own CA (EC P-256); the key never leaves the shared folder
  client.crt/.key      what `raystack env` gives `ray status`, `ray job` and drivers off the cluster

Each node program signs a certificate of its own with its IP address in the subject alternative
names (Ray's gRPC clients check it) into `node_dir()`: a 0700 folder of this user on the node's
own /dev/shm, at the same path on every node. The same path matters: frameworks forward their
driver's environment to every actor (`runtime_env={"env_vars": dict(os.environ)}`), and then every
node must find its own certificate under the driver's RAY_TLS_SERVER_CERT.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from raystack.errors import RaystackError
from raystack.store import paths
from raystack.store.files import atomic_write, locked

VALID = datetime.timedelta(days=3650)  # a CA per `raystack up`: it lives as long as the folder
SKEW = datetime.timedelta(hours=1)  # nodes whose clocks run a little behind still accept them
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Identity:
    """A certificate and its key (PEM files), as Ray's RAY_TLS_SERVER_CERT/KEY name them."""

    cert: Path
    key: Path


# What Ray reads (every gRPC server and client of a process; see ray_env).
RAY_VARIABLES = ("RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


def folder(name: str) -> Path:
    return paths.cluster(name).tls


def ca_cert(name: str) -> Path:
    return folder(name) / "ca.crt"


def ca_key(name: str) -> Path:
    return folder(name) / "ca.key"


def client(name: str) -> Identity:
    return Identity(folder(name) / "client.crt", folder(name) / "client.key")


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _cert_pem(cert) -> str:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _leaf(ca_key, ca, common_name: str, ips: list[str], hosts: list[str]):
    """A certificate for both ends of a gRPC connection (server and client auth), signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    names += [x509.DNSName(h) for h in hosts]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(min(now + VALID, ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def create_ca(name: str) -> Path:
    """A fresh CA (and client certificate) in the cluster folder: every `raystack up` makes one,
    so certificates of an earlier cluster of this name are worth nothing."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    tls = folder(name)
    tls.mkdir(mode=0o700, exist_ok=True)
    os.chmod(tls, 0o700)
    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"raystack CA of cluster {name}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    # The key first: a CA certificate on disk always has its key beside it.
    atomic_write(ca_key(name), _key_pem(key), mode=0o600)
    atomic_write(ca_cert(name), _cert_pem(ca), mode=0o600)
    ckey, cert = _leaf(key, ca, f"raystack client of cluster {name}", [], [])
    ident = client(name)
    atomic_write(ident.key, _key_pem(ckey), mode=0o600)
    atomic_write(ident.cert, _cert_pem(cert), mode=0o600)
    return ca_cert(name)


def ensure_ca(name: str) -> Path:
    """The cluster's CA, made when missing: an allocation started by hand has none yet."""
    if not ca_cert(name).exists():
        with locked(paths.cluster(name)):
            if not ca_cert(name).exists():
                create_ca(name)
    return ca_cert(name)


def node_dir(alloc_id: str, base: Path = SHM) -> Path:
    """This node's folder for its certificate: the same path on every node of an allocation,
    private (0700, owned by this user: checked, since /dev/shm is shared by every user)."""
    path = base / f"rs-tls-{os.getuid()}-{alloc_id}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RaystackError(f"cannot make {path} for this node's TLS certificate: {exc}") from exc
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise RaystackError(f"{path} is not a private folder of this user: remove it, then start again")
    return path


def local_addresses() -> list[str]:
    """This node's IPv4 addresses, on every interface."""
    import socket

    import psutil

    interfaces = psutil.net_if_addrs().values()
    return [a.address for addrs in interfaces for a in addrs if a.family == socket.AF_INET]


def issue_node_cert(name: str, ip: str, host: str, into: Path) -> Identity:
    """Sign this node's certificate (its IP and host name in the SAN) with the cluster's CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    tls = folder(name)
    try:
        ca = x509.load_pem_x509_certificate(ca_cert(name).read_bytes())
        signer = serialization.load_pem_private_key(ca_key(name).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise RaystackError(f"cannot read the cluster's CA in {tls}: {exc}") from exc
    # Every address of the node: Ray binds some servers to all of them, and on a local cluster
    # it replaces the 127.0.0.1 it was given with the host's address (and Ray's clients check it).
    ips = list(dict.fromkeys([ip, "127.0.0.1", *local_addresses()]))
    key, cert = _leaf(signer, ca, f"raystack node {host}", ips, list(dict.fromkeys([host, "localhost"])))
    ident = Identity(into / "node.crt", into / "node.key")
    atomic_write(ident.key, _key_pem(key), mode=0o600)
    atomic_write(ident.cert, _cert_pem(cert), mode=0o600)
    return ident


def ray_env(identity: Identity, ca: Path) -> dict[str, str]:
    """Ray's TLS variables: every gRPC server and client of the process uses this identity and
    trusts only certificates signed by the cluster's CA (and asks its peers for one)."""
    return dict(zip(RAY_VARIABLES, ("1", str(identity.cert), str(identity.key), str(ca)), strict=True))
