#!/usr/bin/env python3
"""t/lib/h3_client.py: an HTTP/3 client that goes away mid-request (t/070).

  h3_client.py PORT PATH KEY BODY MODE

Sends POST PATH to 127.0.0.1:PORT over HTTP/3 (aioquic, any certificate)
with an Idempotency-Key of KEY and BODY, the stream ended with the body,
prints "sent" and waits for a line on standard input: the test's word that
the request reached the upstream.  Then it goes away, as MODE says:

  stop   STOP_SENDING on the request stream (H3_REQUEST_CANCELLED), as a
         browser that abandons a request does.  nginx answers it with a
         RESET_STREAM: once that came, nginx has seen the client go, and
         "reset" is printed.  The connection stays until the next line.
  close  CONNECTION_CLOSE: the whole connection goes; prints "closed".

Then it waits for a last line (or the end of its input) and exits.

A response that comes before the client went away makes the test's order
wrong: it is printed ("answered STATUS") and the exit status is 1.
"""

import asyncio
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset

H3_REQUEST_CANCELLED = 0x10C
H3_NO_ERROR = 0x100


def say(line):
    print(line, flush=True)


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.stream_id = None
        self.reset = asyncio.get_running_loop().create_future()
        self.status = None

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id == self.stream_id:
            if not self.reset.done():
                self.reset.set_result(event.error_code)
        for e in self.h3.handle_event(event):
            if isinstance(e, HeadersReceived) and e.stream_id == self.stream_id:
                self.status = dict(e.headers).get(b':status', b'?').decode()

    def post(self, path, key, body):
        self.stream_id = self._quic.get_next_available_stream_id()
        self.h3.send_headers(self.stream_id, [
            (b':method', b'POST'), (b':scheme', b'https'),
            (b':authority', b'localhost'), (b':path', path.encode()),
            (b'idempotency-key', key.encode()),
            (b'content-type', b'application/json'),
            (b'content-length', str(len(body)).encode()),
        ])
        self.h3.send_data(self.stream_id, body, end_stream=True)
        self.transmit()


async def line():
    return await asyncio.get_running_loop().run_in_executor(
        None, sys.stdin.readline)


async def go_away(client, mode):
    if mode == 'stop':
        client._quic.stop_stream(client.stream_id, H3_REQUEST_CANCELLED)
        client.transmit()
        await asyncio.wait_for(client.reset, 30)
        say('reset')
        return
    client.close(error_code=H3_NO_ERROR)
    await client.wait_closed()
    say('closed')


async def main(port, path, key, body, mode):
    conf = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                             verify_mode=ssl.CERT_NONE,
                             server_name='localhost')
    rc = 0
    async with connect('127.0.0.1', port, configuration=conf,
                       create_protocol=Client) as client:
        client.post(path, key, body)
        say('sent')
        await line()
        if client.status is None:
            await go_away(client, mode)
        else:
            say('answered ' + client.status)
            rc = 1
        # the test's last word: it no longer writes to us
        await line()
    return rc


if __name__ == '__main__':
    if len(sys.argv) != 6 or sys.argv[5] not in ('stop', 'close'):
        sys.exit(__doc__)
    p, path, key, body, mode = sys.argv[1:]
    sys.exit(asyncio.run(main(int(p), path, key, body.encode(), mode)))
