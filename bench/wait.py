#!/usr/bin/env python3
"""bench/wait.py: the "wait" scenario of bench/run.sh, waiting duplicates.

One asyncio process is both the slow upstream (it answers every request
after DELAY ms with a body naming the key and a random nonce, and counts
the requests per key) and the client, so that every timestamp comes from
one clock.  For each trial it opens K+1 connections to the edge, sends the
original POST, GAP ms later (uniform in GAP_MIN..GAP_MAX) K duplicates
with the same key and body, and records for each duplicate the time from
the original's response to the duplicate's response.

A baseline phase first runs trials without duplicates, which gives what
an original alone costs Redis (INFO commandstats calls, CPU time from
/proc/PID/task/*/schedstat); the measured phase subtracts that per
original and divides the rest by the number of duplicates.  Redis's own
background CPU, measured while idle for --idle seconds first, is taken
out of both phases' CPU time.

Checks: every original a 201 not replayed, every duplicate a 201 with
Idempotent-Replayed: true and the original's body, the upstream ran once
per key.  Prints one "WAIT key=value ..." line, "WAITCMD name per_waiter
per_original" lines, "WAITFAIL message" lines (the first 10 problems);
the latencies go to --out, one line per duplicate.

  wait.py --edge PORT --upstream PORT --redis PORT --redis-pids "PID ..."
          [--trials 200] [--baseline 50] [--dups 4] [--delay-ms 200]
          [--gap-ms 20:50] [--parallel 4] [--idle 1] [--run ID] [--out FILE]
"""

import argparse
import asyncio
import glob
import json
import math
import random
import sys
import time

BODY = json.dumps({"amount": 1000, "currency": "EUR",
                   "customer": "cus_bench"}).encode()
TIMEOUT = 10.0


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--edge", type=int, required=True)
    p.add_argument("--upstream", type=int, required=True)
    p.add_argument("--redis", type=int, required=True)
    p.add_argument("--redis-pids", default="")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--baseline", type=int, default=50)
    p.add_argument("--dups", type=int, default=4)
    p.add_argument("--delay-ms", type=float, default=200)
    p.add_argument("--gap-ms", default="20:50")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--run", default="wait")
    p.add_argument("--idle", type=float, default=1.0)
    p.add_argument("--out", default=None)
    return p.parse_args()


# --- the slow upstream --------------------------------------------------------

class Upstream:
    def __init__(self, delay):
        self.delay = delay
        self.runs = {}

    async def serve(self, reader, writer):
        # HTTP/1.1 with keepalive, as nginx's upstream keepalive sends it
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                headers = parse_message(head)[1]
                n = int(headers.get("content-length", "0"))
                if n:
                    await reader.readexactly(n)
                key = headers.get("idempotency-key", "")
                self.runs[key] = self.runs.get(key, 0) + 1
                await asyncio.sleep(self.delay)
                body = json.dumps({"key": key, "run": self.runs[key],
                                   "nonce": random.getrandbits(64)}).encode()
                writer.write(b"HTTP/1.1 201 Created\r\n"
                             b"Content-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except asyncio.CancelledError:
            pass  # nginx's keepalive connections at the end of the run
        finally:
            writer.close()


def parse_message(head):
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def parse_head(head):
    first, headers = parse_message(head)
    parts = first.split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return status, headers


# --- the client ---------------------------------------------------------------

async def send(writer, port, key, expect):
    writer.write(b"POST /pay HTTP/1.1\r\n"
                 b"Host: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Idempotency-Key: %s\r\n"
                 b"X-Bench-Expect: %s\r\n"
                 b"Connection: close\r\n"
                 b"Content-Length: %d\r\n\r\n"
                 % (port, key.encode(), expect, len(BODY)) + BODY)
    await writer.drain()


async def response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status, headers = parse_head(head)
    n = int(headers.get("content-length", "-1"))
    body = await reader.readexactly(n) if n >= 0 else await reader.read()
    return time.perf_counter(), status, headers, body


class Bench:
    def __init__(self, a, upstream):
        self.a = a
        self.upstream = upstream
        self.gap = [float(x) / 1000 for x in a.gap_ms.split(":")]
        self.latencies = []
        self.originals = []
        self.problems = []
        self.keys = []

    def problem(self, msg):
        self.problems.append(msg)

    async def trial(self, key, dups):
        a = self.a
        conns = [await asyncio.open_connection("127.0.0.1", a.edge)
                 for _ in range(dups + 1)]
        try:
            t0 = time.perf_counter()
            await send(conns[0][1], a.edge, key, b"new")
            orig = asyncio.ensure_future(response(conns[0][0]))
            await asyncio.sleep(random.uniform(*self.gap))
            for r, w in conns[1:]:
                await send(w, a.edge, key, b"replay")
            reads = [response(r) for r, w in conns[1:]]
            got = await asyncio.wait_for(asyncio.gather(orig, *reads),
                                         TIMEOUT)
        except Exception as e:  # noqa: BLE001 (any failure is a problem)
            self.problem("%s: %s" % (key, e.__class__.__name__ + str(e)))
            return
        finally:
            for r, w in conns:
                w.close()
        self.keys.append(key)
        t_orig, status, headers, body = got[0]
        self.originals.append(t_orig - t0)
        if status != 201 or headers.get("idempotent-replayed"):
            self.problem("%s: original got %d%s" % (
                key, status, " (replayed)"
                if headers.get("idempotent-replayed") else ""))
        for t, s, h, b in got[1:]:
            self.latencies.append(t - t_orig)
            if s != 201 or h.get("idempotent-replayed") != "true":
                self.problem("%s: duplicate got %d, Idempotent-Replayed %s"
                             % (key, s, h.get("idempotent-replayed")))
            elif b != body:
                self.problem("%s: duplicate got another body than the "
                             "original" % key)

    async def phase(self, name, trials, dups):
        sem = asyncio.Semaphore(self.a.parallel)

        async def one(i):
            async with sem:
                await self.trial("%s-%s-%d" % (self.a.run, name, i), dups)

        await asyncio.gather(*(one(i) for i in range(trials)))


# --- Redis and /proc ----------------------------------------------------------

async def commandstats(port):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"INFO commandstats\r\n")
    await w.drain()
    line = await r.readline()
    n = int(line[1:].strip())
    data = (await r.readexactly(n + 2)).decode()
    w.close()
    calls = {}
    for line in data.split("\r\n"):
        # cmdstat_set:calls=1,usec=2,usec_per_call=2.00,...
        if line.startswith("cmdstat_"):
            name, rest = line[8:].split(":", 1)
            calls[name] = int(rest.split(",")[0].split("=")[1])
    return calls


def cpu_ns(pids):
    total = 0
    for pid in pids:
        for f in glob.glob("/proc/%s/task/*/schedstat" % pid):
            try:
                with open(f) as fh:
                    total += int(fh.read().split()[0])
            except OSError:
                pass
    return total


async def snapshot(a, pids):
    return await commandstats(a.redis), cpu_ns(pids)


def delta(s0, s1):
    skip = ("info",)
    d = {}
    for name, v in s1[0].items():
        if name not in skip and v - s0[0].get(name, 0) > 0:
            d[name] = v - s0[0].get(name, 0)
    return d, s1[1] - s0[1]


def pct(values, q):
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)] if v else 0.0


async def main():
    a = parse_args()
    pids = a.redis_pids.split()
    up = Upstream(a.delay_ms / 1000)
    server = await asyncio.start_server(up.serve, "127.0.0.1", a.upstream,
                                        backlog=1024)
    b = Bench(a, up)

    # Redis's own background CPU (serverCron ...), subtracted from the
    # phases: trials are slow, so it would otherwise dominate
    c0, t0 = cpu_ns(pids), time.perf_counter()
    await asyncio.sleep(a.idle)
    idle = (cpu_ns(pids) - c0) / (time.perf_counter() - t0)

    # baseline: originals alone; the stores land after the responses
    s0 = await snapshot(a, pids)
    t0 = time.perf_counter()
    await b.phase("base", a.baseline, 0)
    await asyncio.sleep(0.3)
    s1 = await snapshot(a, pids)
    base_cmds, base_cpu = delta(s0, s1)
    base_cpu -= idle * (time.perf_counter() - t0)
    base_ok = len(b.keys)
    base_keys = b.keys

    b.originals = []
    b.keys = []
    s0 = await snapshot(a, pids)
    t0 = time.perf_counter()
    await b.phase("dup", a.trials, a.dups)
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(0.3)
    s1 = await snapshot(a, pids)
    cmds, cpu = delta(s0, s1)
    cpu -= idle * (time.perf_counter() - t0)
    server.close()

    n = len(b.keys)
    waiters = max(1, n * a.dups)
    per_orig = {c: v / max(1, base_ok) for c, v in base_cmds.items()}
    total_orig = sum(per_orig.values())
    total = sum(cmds.values())
    cpu_orig = base_cpu / max(1, base_ok)

    runs_bad = [k for k in base_keys + b.keys if up.runs.get(k, 0) != 1]
    for k in runs_bad[:10]:
        b.problem("%s: the upstream ran %d times" % (k, up.runs.get(k, 0)))
    if n < a.trials or base_ok < a.baseline:
        b.problem("%d of %d trials did not complete" % (
            a.trials + a.baseline - n - base_ok, a.trials + a.baseline))

    lat = [x * 1000 for x in b.latencies]
    orig = [x * 1000 for x in b.originals]
    print("WAIT trials=%d dups=%d waiters=%d elapsed_s=%.1f "
          "p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f max_ms=%.2f min_ms=%.2f "
          "orig_p50_ms=%.1f cmds_per_original=%.2f cmds_per_waiter=%.2f "
          "redis_us_per_req=%.1f redis_us_per_original=%.1f "
          "redis_us_per_waiter=%.1f redis_idle_us_per_s=%.0f "
          "problems=%d" % (
              n, a.dups, len(lat), elapsed,
              pct(lat, .5), pct(lat, .9), pct(lat, .99),
              max(lat, default=0), min(lat, default=0), pct(orig, .5),
              total_orig, (total - n * total_orig) / waiters,
              cpu / 1000 / max(1, n * (a.dups + 1)), cpu_orig / 1000,
              (cpu - n * cpu_orig) / 1000 / waiters, idle / 1000,
              len(b.problems)))
    for c in sorted(set(cmds) | set(per_orig)):
        print("WAITCMD %s %.3f %.3f" % (
            c, (cmds.get(c, 0) - n * per_orig.get(c, 0)) / waiters,
            per_orig.get(c, 0)))
    for p in b.problems[:10]:
        print("WAITFAIL " + p)
    if a.out:
        with open(a.out, "w") as f:
            f.write("".join("%.3f\n" % x for x in lat))
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
