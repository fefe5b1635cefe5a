#!/usr/bin/env python3
"""The cut proxy: a TCP proxy between nginx and Redis that cuts its
connections, on command.  The tests drive it through t/lib/CutProxy.pm,
the fault campaign (faults/campaign.py) through faults/services.py.

    cutproxy.py LISTEN_PORT REDIS_PORT [LOG]

It prints "ready" once it listens, then reads commands on its standard
input, one a line, and prints "ok" once each is in force.  It exits at
the end of its input, so it never outlives the process that started it.

    cut MODE TIMES [NAMES]
        the next TIMES commands sent to Redis that hold one of NAMES
        (separated by |, default SET) as an argument are cut, MODE:
        before  the chunk that holds the name is not forwarded and the
                connection is closed: Redis never runs the command
        after   the command is forwarded; once Redis has answered it, the
                connection is closed: Redis ran it, its reply is lost
        none    no cut
    random RATE
        from now on (RATE 0: no more), each chunk read from either side
        is, with probability RATE, the last one of its connection, cut
        one of these ways (drawn at random):
            drop     the chunk is not forwarded (a command never reaches
                     Redis, or its reply never reaches nginx)
            partial  a random prefix of it is forwarded (a command or a
                     reply cut in the middle)
            after    it is forwarded, the connection closed 0-20 ms later
                     (Redis ran the command, its reply is most likely lost)

Each cut is a JSON line in LOG: time, direction, way, bytes.
"""

import asyncio
import json
import random
import sys
import time


class Resp:
    """Counts the RESP elements going one way on a connection, commands
    (arrays of bulk strings) or replies, as their bytes go by."""

    def __init__(self):
        self.buf = bytearray()
        self.skip = 0       # bytes of a bulk string (and CRLF) still to come
        self.keep = None    # the bulk string so far, when short
        self.left = []      # per open array: elements still to come
        self.count = 0      # complete elements

    def feed(self, data, names=()):
        """-> the numbers (from 1) of the elements holding a bulk string
        equal to one of names that ends in data."""
        hits = []
        self.buf += data
        i = 0
        while True:
            if self.skip:
                n = min(self.skip, len(self.buf) - i)
                if self.keep is not None:
                    self.keep += self.buf[i:i + n]
                i += n
                self.skip -= n
                if self.skip:
                    break
                if self.keep is not None and bytes(self.keep[:-2]) in names:
                    hits.append(self.count + 1)
                self.keep = None
                self.end()
                continue
            j = self.buf.find(b'\r\n', i)
            if j < 0:
                break
            kind, n = self.buf[i:i + 1], self.buf[i + 1:j]
            i = j + 2
            if kind in (b'$', b'=', b'!') and int(n) >= 0:
                self.skip = int(n) + 2
                self.keep = bytearray() if int(n) <= 64 else None
                continue
            if kind in (b'*', b'~', b'>', b'%') and int(n) > 0:
                self.left.append(int(n) * (2 if kind == b'%' else 1))
                continue
            self.end()      # a line, a null, an empty array
        del self.buf[:i]
        return hits

    def end(self):
        while self.left:
            self.left[-1] -= 1
            if self.left[-1]:
                return
            self.left.pop()
        self.count += 1


class Proxy:
    def __init__(self, redis_port, log):
        self.redis_port, self.log = redis_port, log
        self.mode, self.times, self.names = 'none', 0, set()
        self.rate = 0.0
        self.rng = random.Random(7)

    def control(self, words):
        if words[0] == 'cut' and len(words) in (3, 4) \
                and words[1] in ('before', 'after', 'none'):
            self.mode, self.times = words[1], int(words[2])
            self.names = {w.encode() for w in
                          (words[3] if len(words) == 4 else 'SET').split('|')}
        elif words[0] == 'random' and len(words) == 2:
            self.rate = float(words[1])
        else:
            raise ValueError(' '.join(words))

    def logged(self, direction, way, buf):
        if self.log:
            self.log.write(json.dumps({
                't': round(time.time(), 6), 'dir': direction, 'way': way,
                'bytes': len(buf)}) + '\n')

    async def accept(self, cr, cw):
        try:
            rr, rw = await asyncio.open_connection('127.0.0.1',
                                                   self.redis_port)
        except OSError:
            cw.close()
            return
        # lost: after an "after" cut, the number of the cut command
        conn = {'up': Resp(), 'down': Resp(), 'lost': None,
                'writers': (cw, rw)}
        try:
            await asyncio.gather(self.pipe(self.to_redis, cr, rw, conn),
                                 self.pipe(self.to_nginx, rr, cw, conn),
                                 return_exceptions=True)
        except asyncio.CancelledError:
            pass                # the proxy exits

    @staticmethod
    async def pipe(way, src, dst, conn):
        """One way of a connection, chunk by chunk until way() says it is
        cut; when it ends, both do."""
        try:
            while buf := await src.read(65536):
                if await way(buf, dst, conn):
                    break
        finally:
            for w in conn['writers']:
                w.close()

    async def to_redis(self, buf, dst, conn):
        up = conn['up']
        sent = up.count
        armed = self.mode in ('before', 'after') and self.times > 0 \
            and conn['lost'] is None
        hits = up.feed(buf, self.names if armed else ())
        if hits:
            self.times -= 1
            self.logged('to-redis', self.mode, buf)
            if self.mode == 'before':
                return True
            conn['lost'] = hits[0]
        if conn['lost'] is None:
            return await self.random_cut(buf, dst, 'to-redis')
        # the rest of the cut command goes on, nothing after it
        if sent < conn['lost']:
            dst.write(buf)
            await dst.drain()
        return False

    async def to_nginx(self, buf, dst, conn):
        conn['down'].feed(buf)
        if conn['lost'] is None:
            return await self.random_cut(buf, dst, 'to-nginx')
        # nothing goes on to nginx; the connection ends once Redis has
        # answered the cut command
        return conn['down'].count >= conn['lost']

    async def random_cut(self, buf, dst, direction):
        """Forwards buf, or cuts it at random: -> whether it was cut."""
        if self.rate and self.rng.random() < self.rate:
            way = self.rng.choice(('drop', 'partial', 'after'))
            if way == 'partial':
                dst.write(buf[:self.rng.randrange(len(buf))])
            elif way == 'after':
                dst.write(buf)
                await asyncio.sleep(self.rng.random() * 0.02)
            self.logged(direction, way, buf)
            return True
        dst.write(buf)
        await dst.drain()
        return False


async def main():
    port, redis_port = int(sys.argv[1]), int(sys.argv[2])
    log = open(sys.argv[3], 'a', buffering=1) if len(sys.argv) > 3 else None
    proxy = Proxy(redis_port, log)
    server = await asyncio.start_server(proxy.accept, '127.0.0.1', port,
                                        reuse_address=True)
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    print('ready', flush=True)
    async with server:
        while True:
            line = await commands.readline()
            if not line:
                break
            if not line.split():
                continue
            try:
                proxy.control(line.decode().split())
                print('ok', flush=True)
            except ValueError as e:
                print('error: %s' % e, flush=True)


if __name__ == '__main__':
    asyncio.run(main())
