"""HTTPS in front of the dashboard on a TLS cluster: Ray's dashboard speaks plain HTTP only, so
with `tls: true` it listens on 127.0.0.1 and this forwarder, a thread of the head's node program,
serves it on the node's address with the node's certificate. The bearer token then never crosses
the network in clear; clients check the certificate against the cluster's CA.

It forwards bytes and parses nothing: the token is still checked by the dashboard itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading

from raystack.store.tls import Identity

log = logging.getLogger("raystack.node")


def server_context(identity: Identity) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(identity.cert, identity.key)
    return ctx


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class TlsFront:
    """Listens on (ip, port) with TLS and forwards each connection to 127.0.0.1:target."""

    def __init__(self, ip: str, port: int, target: int, identity: Identity):
        self.ip, self.port, self.target = ip, port, target
        self.context = server_context(identity)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="tls-front", daemon=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            server = self.loop.run_until_complete(
                asyncio.start_server(self._client, self.ip, self.port, ssl=self.context)
            )
        except OSError as exc:
            self.error = exc
            self.ready.set()
            return
        self.ready.set()
        with contextlib.suppress(RuntimeError):  # stopped
            self.loop.run_forever()
        server.close()

    def start(self) -> TlsFront:
        self.thread.start()
        self.ready.wait(30)
        if self.error is not None:
            raise OSError(f"HTTPS front of the dashboard on {self.ip}:{self.port}: {self.error}")
        log.info("dashboard served with TLS on https://%s:%d", self.ip, self.port)
        return self

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
