"""Clients that retry like Stripe's libraries do.

One key per operation, the same key and body on every attempt; retried on
a network error, 409 and 5xx; `Stripe-Should-Retry` / `x-should-retry`
decide first when present ("false": stop); exponential backoff with
jitter, at least `Retry-After`; attempts alternate between the edges.
"""

import asyncio
import time

BASE, FACTOR, CAP = 0.05, 2, 1.0       # seconds
RETRY_AFTER_CAP = 2.0                   # Stripe caps it too (at 60 s)


async def post(port, path, key, body, timeout=5.0, extra=b''):
    """One attempt: a dict with status (0: network error), headers, body."""
    t0 = time.time()
    r = {'t0': t0, 'port': port, 'status': 0, 'headers': {}, 'body': b'',
         'error': ''}
    req = (b'POST %s HTTP/1.1\r\nHost: api\r\nConnection: close\r\n'
           b'Idempotency-Key: %s\r\nContent-Type: application/json\r\n'
           b'Content-Length: %d\r\n%s\r\n'
           % (path.encode(), key.encode(), len(body), extra)) + body
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection('127.0.0.1', port), timeout)
        writer.write(req)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(-1), timeout)
        parse(raw, r)
    except (OSError, asyncio.TimeoutError, ValueError) as e:
        r['error'] = type(e).__name__
        r['status'] = 0
    finally:
        if writer is not None:
            writer.close()
    r['t1'] = time.time()
    return r


def parse(raw, r):
    head, sep, body = raw.partition(b'\r\n\r\n')
    if not sep:
        raise ValueError('no complete header')
    lines = head.decode('latin-1').split('\r\n')
    status = int(lines[0].split(' ')[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(':')
        headers[k.strip().lower()] = v.strip()
    if headers.get('transfer-encoding', '').lower() == 'chunked':
        body = dechunk(body)
    elif 'content-length' in headers \
            and len(body) != int(headers['content-length']):
        raise ValueError('truncated body')
    r.update(status=status, headers=headers, body=body)


def dechunk(b):
    out = b''
    while True:
        size, sep, b = b.partition(b'\r\n')
        if not sep:
            raise ValueError('truncated chunk')
        n = int(size.split(b';')[0], 16)
        if n == 0:
            return out
        out, b = out + b[:n], b[n + 2:]


def should_retry(r):
    if r['status'] == 0:
        return True
    hint = r['headers'].get('stripe-should-retry',
                            r['headers'].get('x-should-retry'))
    if hint == 'false':
        return False
    if hint == 'true':
        return True
    return r['status'] == 409 or r['status'] >= 500


def backoff(n, r, rng):
    """Stripe's: BASE * 2^n capped, times [0.5, 1) jitter, >= Retry-After."""
    sleep = min(BASE * FACTOR ** n, CAP) * (0.5 + rng.random() / 2)
    try:
        ra = float(r['headers'].get('retry-after', 0))
    except ValueError:
        ra = 0
    return max(sleep, min(ra, RETRY_AFTER_CAP))


async def operation(ports, path, key, body, attempts, rng, start=None):
    """Every attempt of one operation, the last one being its answer."""
    first = rng.randrange(len(ports)) if start is None else start
    tried = []
    for n in range(attempts):
        r = await post(ports[(first + n) % len(ports)], path, key, body)
        tried.append(r)
        if n == attempts - 1 or not should_retry(r):
            break
        await asyncio.sleep(backoff(n, r, rng))
    return tried
