"""Mutual TLS material: the cluster CA, node and client certificates, real TLS handshakes with
them (Python's ssl, the same OpenSSL-style checks gRPC makes), and the HTTPS front."""

from __future__ import annotations

import http.server
import ipaddress
import os
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from raystack.allocation.head.tlsfront import TlsFront
from raystack.allocation.node.context import NodeContext
from raystack.allocation.node.raystart import ray_env, ray_start_argv
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import tls


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "home"))
    records.create("c")
    return tmp_path


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_ca_and_client_identity_are_private_and_chain(home: Path) -> None:
    ca_path = tls.create_ca("c")
    folder = tls.folder("c")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for f in folder.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    ca = load(ca_path)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    client = load(tls.client("c").cert)
    client.verify_directly_issued_by(ca)
    assert not client.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_every_up_makes_a_new_ca_and_ensure_keeps_it(home: Path) -> None:
    first = tls.create_ca("c").read_bytes()
    assert tls.ensure_ca("c").read_bytes() == first
    assert tls.create_ca("c").read_bytes() != first


def test_a_node_certificate_names_its_address_and_is_signed_by_the_ca(home: Path, tmp_path: Path) -> None:
    tls.create_ca("c")
    into = tls.node_dir("123", base=tmp_path)
    ident = tls.issue_node_cert("c", "10.200.0.12", "node2", into)
    cert = load(ident.cert)
    cert.verify_directly_issued_by(load(tls.ca_cert("c")))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.200.0.12") in san.get_values_for_type(x509.IPAddress)
    assert "node2" in san.get_values_for_type(x509.DNSName)
    assert stat.S_IMODE(ident.key.stat().st_mode) == 0o600


def test_the_node_folder_is_the_same_path_on_every_node_and_private(tmp_path: Path) -> None:
    a, b = tls.node_dir("55", base=tmp_path), tls.node_dir("55", base=tmp_path)
    assert a == b == tmp_path / f"rs-tls-{os.getuid()}-55"
    assert stat.S_IMODE(a.stat().st_mode) == 0o700
    loose = tmp_path / f"rs-tls-{os.getuid()}-56"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(RaystackError, match="not a private folder"):
        tls.node_dir("56", base=tmp_path)


def test_a_node_without_the_ca_says_where_it_looked(home: Path, tmp_path: Path) -> None:
    with pytest.raises(RaystackError, match="cannot read the cluster's CA"):
        tls.issue_node_cert("c", "10.0.0.1", "n", tmp_path)


def server_context(ident: tls.Identity, ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
    ctx.load_cert_chain(ident.cert, ident.key)
    ctx.verify_mode = ssl.CERT_REQUIRED  # as Ray's gRPC servers: a peer certificate or nothing
    return ctx


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> str | None:
    """One TLS handshake over a socket pair; None when it succeeded, else the client's error."""
    left, right = socket.socketpair()
    failure: list[str] = []

    def serve() -> None:
        try:
            with server.wrap_socket(left, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(right, server_hostname=host) as c:
            c.sendall(b"x")
            c.recv(1)  # (the server's verdict on our certificate arrives with TLS 1.3's first read)
    except (ssl.SSLError, OSError) as exc:
        failure.append(str(exc))
    thread.join(5)
    return failure[0] if failure else None


def test_mutual_tls_with_the_certificates(home: Path, tmp_path: Path) -> None:
    ca = tls.create_ca("c")
    node = tls.issue_node_cert("c", "10.0.0.7", "node7", tls.node_dir("1", base=tmp_path))
    server = server_context(node, ca)
    with_cert = ssl.create_default_context(cafile=str(ca))
    with_cert.load_cert_chain(tls.client("c").cert, tls.client("c").key)
    assert handshake(server, with_cert, "10.0.0.7") is None
    # The node's address is what the client checks: another address fails.
    assert "match" in (handshake(server, with_cert, "10.0.0.8") or "")
    # No client certificate: refused during the handshake, before any request.
    without = ssl.create_default_context(cafile=str(ca))
    assert handshake(server, without, "10.0.0.7") is not None
    # A certificate from another cluster's CA: refused both ways.
    records.create("other")
    tls.create_ca("other")
    stranger = ssl.create_default_context(cafile=str(tls.ca_cert("other")))
    stranger.load_cert_chain(tls.client("other").cert, tls.client("other").key)
    assert handshake(server, stranger, "10.0.0.7") is not None


def ctx_with(tmp_path: Path, ident: tls.Identity | None) -> NodeContext:
    c = NodeContext("c", "9", 0, 1, "node1", "10.0.0.1", 0, 1, tmp_path / "t", 1 << 27, 30.0)
    c.tls = ident
    return c


def test_ray_gets_the_tls_variables_and_a_loopback_dashboard(home: Path, tmp_path: Path) -> None:
    tls.create_ca("c")
    ident = tls.issue_node_cert("c", "10.0.0.1", "node1", tls.node_dir("9", base=tmp_path))
    env = ray_env(ctx_with(tmp_path, ident))
    assert env["RAY_USE_TLS"] == "1" and env["RAY_TLS_SERVER_CERT"] == str(ident.cert)
    assert env["RAY_TLS_CA_CERT"] == str(tls.ca_cert("c"))
    # (more object-manager connections per peer: each encrypts on one thread of its own)
    assert env["RAY_object_manager_client_connection_num"] == "16"
    assert "RAY_object_manager_client_connection_num" not in ray_env(ctx_with(tmp_path, None))
    ports = dict.fromkeys(["object_manager", "node_manager", "agent_listen", "agent_grpc"], 1)
    ports |= {"metrics": 2, "runtime_env": 3, "min_worker": 4, "max_worker": 5, "gcs": 6}
    ports |= {"dashboard": 7, "client_server": 8, "dashboard_http": 9}
    argv = ray_start_argv(ctx_with(tmp_path, ident), ports, None)
    assert "--dashboard-host=127.0.0.1" in argv and "--dashboard-port=9" in argv
    plain = ray_start_argv(ctx_with(tmp_path, None), ports, None)
    assert "--dashboard-host=10.0.0.1" in plain and "--dashboard-port=7" in plain


def test_without_tls_a_shells_tls_variables_are_not_passed_to_ray(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_USE_TLS", "1")
    monkeypatch.setenv("RAY_TLS_CA_CERT", "/elsewhere/ca.crt")
    env = ray_env(ctx_with(tmp_path, None))
    assert "RAY_USE_TLS" not in env and "RAY_TLS_CA_CERT" not in env


def test_a_profiles_object_manager_connections_win_over_the_tls_default(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls.create_ca("c")
    ident = tls.issue_node_cert("c", "10.0.0.1", "node1", tls.node_dir("9", base=tmp_path))
    monkeypatch.setenv("RAY_object_manager_client_connection_num", "8")  # (the profile's env)
    assert ray_env(ctx_with(tmp_path, ident))["RAY_object_manager_client_connection_num"] == "8"


@pytest.fixture
def plain_http() -> Iterator[int]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"hello {self.headers.get('Authorization')}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_the_https_front_serves_the_dashboard_with_the_node_certificate(
    home: Path, tmp_path: Path, plain_http: int
) -> None:
    tls.create_ca("c")
    ident = tls.issue_node_cert("c", "127.0.0.1", "localhost", tls.node_dir("3", base=tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    front = TlsFront("127.0.0.1", port, plain_http, ident).start()
    try:
        reply = httpx.get(
            f"https://127.0.0.1:{port}/",
            verify=ssl.create_default_context(cafile=str(tls.ca_cert("c"))),
            headers={"Authorization": "Bearer t"},
        )
        assert reply.text == "hello Bearer t"  # forwarded, header and all
        with pytest.raises(httpx.ConnectError):  # a client that does not know the CA
            httpx.get(f"https://127.0.0.1:{port}/")
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
    finally:
        front.stop()
