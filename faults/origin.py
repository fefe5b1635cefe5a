#!/usr/bin/env python3
"""The fault campaign's origin: a payment API that counts executions.

    origin.py PORT LOG

Every POST with an Idempotency-Key is an operation on that key.  An
execution "commits" (a charge id is drawn, a `commit` line is written and
flushed to LOG) before any byte of the answer is sent, so LOG is the truth
about what ran even when the answer never arrives.

The round's misbehaviour is set with `POST /_control` (JSON: modes, rate,
delay, late, seed).  It applies to the first arrival of a key only, with
probability `rate`, one of `modes` drawn at random:
    timeout       commit, answer after `late` s (past proxy_read_timeout)
    reset-after   commit, then reset the connection
    reset-before  reset the connection without committing
    err500        commit, answer 500 (the execution's own answer)
    busy503       answer 503 without committing
Other arrivals commit and answer after `delay` s.  Paths ending in /quick
(the recovery prober's) never misbehave and never wait.

A request with `Idempotency-Previous-Outcome: unknown` for a key that was
executed gets the first execution's answer again, byte for byte, without a
new execution (deduplication by key), except under /forward-nodedup/: that
variant executes again, to show what `idempotency_on_unknown forward`
needs from its upstream.
"""

import asyncio
import json
import os
import random
import socket
import struct
import sys
import time


class Origin:
    def __init__(self, log_path):
        self.log = open(log_path, 'a', buffering=1)
        self.arrivals = {}      # key -> count
        self.execs = {}         # key -> count
        self.first = {}         # key -> (status, body) of the first execution
        self.control = {'modes': [], 'rate': 0.0, 'delay': 0.0,
                        'late': 2.0, 'seed': 1, 'round': ''}
        self.rng = random.Random(1)

    def write(self, **ev):
        ev['t'] = round(time.time(), 6)
        # one write per line: the campaign may read while we run
        self.log.write(json.dumps(ev, separators=(',', ':')) + '\n')

    async def handle(self, reader, writer):
        try:
            req = await read_request(reader)
            if req is not None:
                await self.serve(req, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve(self, req, writer):
        method, path, headers, body = req
        if path == '/_control':
            self.control.update(json.loads(body or b'{}'))
            self.rng = random.Random(self.control['seed'])
            respond(writer, 200, b'ok\n')
            return
        key = headers.get('idempotency-key', '')
        prev = headers.get('idempotency-previous-outcome', '')
        probe = 'x-probe' in headers
        n = self.arrivals[key] = self.arrivals.get(key, 0) + 1
        self.write(ev='arrive', key=key, path=path, n=n, prev=prev,
                   probe=probe)

        if prev == 'unknown' and key in self.first \
                and not path.startswith('/forward-nodedup/'):
            status, out = self.first[key]
            self.write(ev='dedup', key=key, status=status)
            respond(writer, status, out)
            return

        c = self.control
        mode = 'none'
        quick = path.endswith('/quick')
        if n == 1 and not quick and c['modes'] \
                and self.rng.random() < c['rate']:
            mode = self.rng.choice(c['modes'])
        if mode == 'reset-before':
            self.write(ev='reset', key=key, mode=mode)
            reset(writer)
            return
        if mode == 'busy503':
            self.write(ev='answer', key=key, status=503, mode=mode)
            respond(writer, 503, b'{"error":"busy, nothing was done"}\n')
            return

        # the commit: from here on the charge exists
        e = self.execs[key] = self.execs.get(key, 0) + 1
        charge = 'ch_%016x' % self.rng.getrandbits(64)
        status = 500 if mode == 'err500' else 200
        what = 'failed after commit' if status == 500 else 'succeeded'
        doc = {'id': charge, 'object': 'charge', 'key': key,
               'execution': e, 'status': what, 'amount': amount_of(body)}
        if status == 500 and path.startswith('/v1/'):
            # Stripe's error shape, which its library turns into an error
            doc = {'error': {'type': 'api_error', 'message': what,
                             'charge': charge}}
        out = json.dumps(doc, separators=(',', ':')).encode() + b'\n'
        self.first.setdefault(key, (status, out))
        self.write(ev='commit', key=key, path=path, exec=e, status=status,
                   mode=mode, body=out.decode(), probe=probe)

        if mode == 'reset-after':
            reset(writer)
            return
        wait = c['late'] if mode == 'timeout' else (0 if quick else c['delay'])
        if wait:
            await asyncio.sleep(wait)
        respond(writer, status, out)
        await writer.drain()
        self.write(ev='answer', key=key, status=status, mode=mode)


def amount_of(body):
    try:
        return json.loads(body).get('amount')
    except ValueError:
        return None     # the Stripe library sends a form


async def read_request(reader):
    head = await reader.readuntil(b'\r\n\r\n')
    lines = head.decode('latin-1').split('\r\n')
    method, path, _ = lines[0].split(' ', 2)
    headers = {}
    for line in lines[1:]:
        if ':' in line:
            k, v = line.split(':', 1)
            headers[k.strip().lower()] = v.strip()
    n = int(headers.get('content-length', '0'))
    body = await reader.readexactly(n) if n else b''
    return method, path.split('?')[0], headers, body


REASONS = {200: 'OK', 500: 'Internal Server Error', 503: 'Service Unavailable'}


def respond(writer, status, body):
    writer.write(b'HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n'
                 b'Content-Length: %d\r\nConnection: close\r\n\r\n'
                 % (status, REASONS.get(status, 'X').encode(), len(body))
                 + body)


def reset(writer):
    # SO_LINGER 0: close sends RST, as a crashed or killed backend does
    sock = writer.get_extra_info('socket')
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                    struct.pack('ii', 1, 0))
    writer.transport.abort()


async def main():
    port, log_path = int(sys.argv[1]), sys.argv[2]
    origin = Origin(log_path)
    server = await asyncio.start_server(origin.handle, '127.0.0.1', port,
                                        backlog=512, reuse_address=True)
    # the campaign waits for this file before it sends traffic
    with open(log_path + '.ready', 'w') as f:
        f.write(str(os.getpid()))
    async with server:
        await server.serve_forever()


if __name__ == '__main__':
    asyncio.run(main())
