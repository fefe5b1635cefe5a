#!/usr/bin/env python3
"""A TCP proxy between nginx and Redis that cuts connections at random points.

    cutproxy.py LISTEN_PORT REDIS_PORT RATE LOG

Passes bytes through untouched until SIGUSR1; from then until SIGUSR2, each
chunk read from either side is, with probability RATE, the last one of its
connection, cut one of these ways (drawn at random):
    drop     the chunk is not forwarded (a command never reaches Redis, or
             its reply never reaches nginx)
    partial  a random prefix of it is forwarded (a command or a reply cut
             in the middle)
    after    it is forwarded, the connection closed 0-20 ms later (Redis
             ran the command, its reply is most likely lost)
Each cut is a JSON line in LOG: time, direction, way, bytes.
"""

import asyncio
import json
import random
import signal
import sys
import time

cutting = False


def on(*_):
    global cutting
    cutting = True


def off(*_):
    global cutting
    cutting = False


async def pipe(src, dst, direction, rate, log, rng, close_both):
    while True:
        buf = await src.read(65536)
        if not buf:
            break
        if cutting and rng.random() < rate:
            way = rng.choice(('drop', 'partial', 'after'))
            if way == 'partial':
                dst.write(buf[:rng.randrange(len(buf))])
            elif way == 'after':
                dst.write(buf)
                await asyncio.sleep(rng.random() * 0.02)
            log.write(json.dumps({'t': round(time.time(), 6), 'dir': direction,
                                  'way': way, 'bytes': len(buf)}) + '\n')
            break
        dst.write(buf)
        await dst.drain()
    close_both()


async def main():
    port, redis_port = int(sys.argv[1]), int(sys.argv[2])
    rate = float(sys.argv[3])
    log = open(sys.argv[4], 'a', buffering=1)
    rng = random.Random(7)

    async def accept(cr, cw):
        try:
            rr, rw = await asyncio.open_connection('127.0.0.1', redis_port)
        except OSError:
            cw.close()
            return

        def close_both():
            cw.close()
            rw.close()

        await asyncio.gather(
            pipe(cr, rw, 'to-redis', rate, log, rng, close_both),
            pipe(rr, cw, 'to-nginx', rate, log, rng, close_both),
            return_exceptions=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, on)
    loop.add_signal_handler(signal.SIGUSR2, off)
    server = await asyncio.start_server(accept, '127.0.0.1', port,
                                        reuse_address=True)
    async with server:
        await server.serve_forever()


if __name__ == '__main__':
    asyncio.run(main())
