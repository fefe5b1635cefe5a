#!/usr/bin/env python3
"""The fault campaign: retried POSTs through two nginx instances (two
workers each) to an origin that counts executions, one fault per round,
every key judged (faults/judge.py).

    campaign.py [--short] [--rounds NAME,...] [--out DIR] [--doc FILE]

--short: the reduced campaign of t/045 (a few keys, the cheap faults, keep
and release); --rounds: only those rounds, to replay one.  The module is
$FAULTS_MODULE (or $TEST_NGINX_MODULE, else
build/ngx_http_idempotency_module.so); nginx is $TEST_NGINX_BINARY.  Ports
$FAULTS_PORT_BASE (27000) +201..+220 and, for the Sentinel rounds, the
topology at +31..+43.  The last line is "N passed, N failed".
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import judge            # noqa: E402
import timeline         # noqa: E402
from client import operation, post              # noqa: E402
from services import (TOP, CutProxy, Nginx, Proc, Redis,  # noqa: E402
                      Topology, wait_for)

LEASE = 3.0             # idempotency_lock_ttl
# a dead owner's lease is read as lost a third of the lock after its
# deadline (a margin for clock differences between the instances)
LOST_AFTER = LEASE * 4 / 3
READ_TIMEOUT = 1.0      # proxy_read_timeout
LATE = 1.6              # the origin's late answer, past READ_TIMEOUT
ATTEMPTS = 10           # per operation, as maxNetworkRetries + 1
POLICIES = ('keep', 'forward', 'forward-nodedup', 'release')


# ------------------------------------------------------------ the faults

async def at(t0, secs):
    await asyncio.sleep(max(0, t0 + secs - time.time()))


async def kill_workers(c, t0):
    """SIGKILL one worker of each edge while requests are at the origin."""
    first = None
    for edge, when in ((c.edges[0], 0.8), (c.edges[1], 1.6)):
        await at(t0, when)
        pid = random.Random(when).choice(edge.workers())
        os.kill(pid, signal.SIGKILL)
        c.note('SIGKILL worker %d of nginx %s' % (pid, edge.name))
        first = first or time.time()
    return first, time.time()


async def reloads(c, t0):
    for i, when in enumerate((0.5, 1.0, 1.5, 2.0)):
        await at(t0, when)
        edge = c.edges[i % 2]
        await asyncio.to_thread(edge.reload)
        c.note('nginx -s reload of %s' % edge.name)
    return t0 + 0.5, time.time()


async def between(t0, begin, end, on, off):
    """on() at t0 + begin, off() at t0 + end: the fault's window."""
    await at(t0, begin)
    on()
    start = time.time()
    await at(t0, end)
    await asyncio.to_thread(off)
    return start, time.time()


async def redis_stop(c, t0):
    w = await between(t0, 0.8, 2.3, lambda: c.redis.signal(signal.SIGSTOP),
                      lambda: c.redis.signal(signal.SIGCONT))
    c.note('Redis SIGSTOP for %.2f s' % (w[1] - w[0]))
    return w


async def redis_kill(c, t0):
    w = await between(t0, 0.8, 1.8, c.redis.kill9, c.redis.start)
    c.note('Redis kill -9, restarted from its AOF after %.2f s'
           % (w[1] - w[0]))
    return w


async def redis_cut(c, t0):
    return await between(t0, 0.3, 2.8,
                         lambda: c.cutter.command('random 0.15'),
                         lambda: c.cutter.command('random 0'))


async def sentinel_failover(c, t0):
    await at(t0, 1.0)
    start = time.time()
    line = await c.topo.action('sentinel-failover')
    c.note(line)
    m = re.search(r'seen by 3 sentinels in (\d+) ms', line)
    return start, start + int(m.group(1)) / 1000 if m else time.time()


async def sentinel_kill(c, t0):
    """kill -9 of the master; once the Sentinels switched, it is started
    again and rejoins as a replica (WAIT 2 can be met again)."""
    await at(t0, 1.0)
    start = time.time()
    line = await c.topo.action('sentinel-kill-master')
    c.note(line)
    end = time.time()
    dead = re.search(r'killed (\d+)', line).group(1)
    await asyncio.to_thread(c.topo.restart, int(dead))
    c.note('%s started again, a replica' % dead)
    return start, end


#   name, target (direct | cut | sentinel), origin misbehaviour (modes,
#   rate; delay: the normal answer's latency), fault, short: in --short;
#   owner_loss: outcome-unknown without the origin seeing the key is
#   allowed ('killed': when the client saw its owner's connection die;
#   'outage': Redis out of reach longer than a lease, for a key whose
#   claim failed then: its release could not be delivered); must_rerun:
#   policy -> why it must show a re-execution
SENTINEL = ['sentinel', 'sentinel-w1']
# target -> (label in the table, WAIT N with the Sentinel topology's two
# replicas; 1 of 2 may be met by the replica that is not promoted: its
# re-executions are reported, not failed, as release's are)
TARGETS = {'direct': ('standalone', None), 'cut': ('standalone, cut', None),
           'sentinel': ('Sentinel, WAIT 2/2', 2),
           'sentinel-w1': ('Sentinel, WAIT 1/2', 1)}
RERUN = {'release': 'release runs a timed-out key again',
         'forward-nodedup': 'forward needs a deduplicating upstream'}
ROUNDS = [
    dict(name='none', short=True),
    dict(name='origin-timeout', modes=['timeout'], short=True,
         must_rerun=RERUN),
    dict(name='origin-reset-after', modes=['reset-after'], short=True),
    dict(name='origin-reset-before', modes=['reset-before']),
    dict(name='origin-500', modes=['err500'], short=True),
    dict(name='origin-503', modes=['busy503'], short=True),
    dict(name='worker-kill', delay=0.4, fault=kill_workers, short=True,
         owner_loss='killed'),
    dict(name='reload', delay=0.3, fault=reloads),
    dict(name='redis-stop', delay=0.3, fault=redis_stop, short=True),
    dict(name='redis-kill', delay=0.3, fault=redis_kill),
    dict(name='redis-cut', targets=['cut'], delay=0.2, fault=redis_cut,
         short=True),
    dict(name='sentinel-failover', targets=SENTINEL, delay=0.3,
         fault=sentinel_failover, spread=5.0),
    dict(name='sentinel-kill-master', targets=SENTINEL, delay=0.3,
         fault=sentinel_kill, spread=6.0, owner_loss='outage'),
]


# ------------------------------------------------------------ the setup

def edge_conf(c, name, i):
    module = c.module
    servers = ''
    for target, port in c.targets(i):
        redis = {'direct': '127.0.0.1:%d' % c.port('redis'),
                 'cut': '127.0.0.1:%d' % c.port('cut')}.get(target)
        if target.startswith('sentinel'):
            redis = ' '.join('127.0.0.1:%d' % p for p in c.topo.sentinels) \
                + ' sentinel=idem;\n        idempotency_redis_wait %d' \
                % TARGETS[target][1]
        locs = ''.join('''
        location /%s/ {
            idempotency on;
            idempotency_on_unknown %s;
            proxy_pass http://127.0.0.1:%d;
        }''' % (p, p.split('-')[0], c.port('origin')) for p in POLICIES)
        servers += '''
    server {
        listen 127.0.0.1:%d;
        idempotency_redis %s;%s
        location /v1/ {
            idempotency on;
            proxy_pass http://127.0.0.1:%d;
        }
    }''' % (port, redis, locs, c.port('origin'))
    log = ('{"t":$msec,"pid":$pid,"port":$server_port,'
           '"key":"$http_idempotency_key","hash":"$idempotency_key_hash",'
           '"idem":"$idempotency_status","status":$status,'
           '"up":"$upstream_status","rt":$request_time,"uri":"$uri",'
           '"probe":"$http_x_probe"}')
    return '''load_module %s;
%s
worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;
events { worker_connections 2048; }
http {
    client_body_temp_path body;
    proxy_temp_path proxy;
    log_format faults escape=json '%s';
    access_log logs/faults.log faults;
    idempotency_redis_timeout 300ms;
    idempotency_lock_ttl %ds;
    idempotency_ttl 1h;
    proxy_read_timeout %dms;
    proxy_connect_timeout 1s;
    add_header X-Idem $idempotency_status always;
    add_header X-Edge "%s/$pid" always;
%s
}
''' % (module, 'user root;' if os.geteuid() == 0 else '', log, LEASE,
       READ_TIMEOUT * 1000, name, servers)


class Campaign:
    def __init__(self, args):
        self.args, self.short = args, args.short
        self.base = int(os.environ.get('FAULTS_PORT_BASE', 27000))
        self.out = os.path.abspath(args.out)
        self.module = os.path.abspath(
            os.environ.get('FAULTS_MODULE')
            or os.environ.get('TEST_NGINX_MODULE')
            or os.path.join(TOP, 'build/ngx_http_idempotency_module.so'))
        self.nginx = os.environ.get('TEST_NGINX_BINARY', '/usr/sbin/nginx')
        self.run = 'f%d' % int(time.time())
        self.notes, self.rows, self.failing = [], [], []
        only = args.rounds.split(',') if args.rounds else []
        self.sentinel = not self.short and (not only or any(
            r['name'] in only for r in ROUNDS if r.get('targets') == SENTINEL))
        self.procs = []

    def port(self, what):
        return self.base + {'redis': 201, 'cut': 202, 'origin': 220}[what]

    def targets(self, i):
        """(target, port) of edge i's servers."""
        names = ['direct', 'cut'] + (SENTINEL if self.sentinel else [])
        return [(t, self.base + 210 + 2 * n + i) for n, t in enumerate(names)]

    def ports_of(self, target):
        return [dict(self.targets(i))[target] for i in (0, 1)]

    def note(self, text):
        line = '%s %s' % (timeline.clock(time.time()), text)
        self.notes.append(line)
        print('  ' + line, flush=True)

    def setup(self):
        if os.path.exists(self.out):
            shutil.rmtree(self.out)
        os.makedirs(self.out)
        o = self.out
        self.redis = Redis(self.port('redis'), os.path.join(o, 'redis'))
        self.procs.append(self.redis)
        self.redis.start()
        self.topo = Topology(self.base, os.path.join(o, 'topo'))
        if self.sentinel:
            self.procs.append(self.topo)
            print('  ' + self.topo.start(), flush=True)
        self.origin_log = os.path.join(o, 'origin.log')
        origin = Proc([os.path.join(HERE, 'origin.py'),
                       str(self.port('origin')), self.origin_log],
                      os.path.join(o, 'origin.err'))
        self.cutter = CutProxy(self.port('cut'), self.port('redis'),
                               os.path.join(o, 'cuts.log'),
                               os.path.join(o, 'cutproxy.err'))
        for p in (origin, self.cutter):
            self.procs.append(p)
            p.start()
        wait_for(lambda: os.path.exists(self.origin_log + '.ready'), 10,
                 'the origin')
        self.edges = []
        for i, name in enumerate('AB'):
            e = Nginx(name, os.path.join(o, 'nginx-' + name), self.nginx,
                      edge_conf(self, name, i))
            self.procs.append(e)
            e.start()
            self.edges.append(e)
        self.nodes = {self.port('redis'): self.redis.dir}
        if self.sentinel:
            self.nodes.update((p, self.topo.dir) for p in self.topo.data)
        self.names = timeline.Names(list(self.nodes))
        time.sleep(0.5)

    def teardown(self):
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception as e:      # the others must stop all the same
                print('  stopping %s: %s' % (type(p).__name__, e))

    # -------------------------------------------------------- one round

    async def control(self, **kw):
        body = json.dumps(kw).encode()
        r = await post(self.port('origin'), '/_control', 'control', body)
        assert r['status'] == 200, r

    async def prober(self, ports, samples, tag):
        """A fresh key every 100 ms on each edge: when service is back."""
        n = 0
        while True:
            for p in ports:
                n += 1
                r = await post(p, '/keep/quick', '%s-probe-%d' % (tag, n),
                               b'{}', timeout=2.0)
                samples.append({'port': p, 't0': r['t0'], 't1': r['t1'],
                                'status': r['status']})
            await asyncio.sleep(0.1)

    async def round(self, rnd):
        name = rnd['name']
        targets = rnd.get('targets', ['direct'])
        policies = ('keep', 'release') if self.short else POLICIES
        per = 4 if self.short else 25
        spread = rnd.get('spread', 1.5 if self.short else 3.0)
        tag = '%s-%s' % (self.run, name)
        seed = sum(map(ord, name))
        rng = random.Random(seed)
        print('round %s (%s)' % (name, ', '.join(TARGETS[t][0]
                                                 for t in targets)),
              flush=True)
        await self.control(modes=rnd.get('modes', []), rate=0.8,
                           delay=rnd.get('delay', 0.05), late=LATE,
                           seed=seed)

        keys = {}
        t0 = time.time()

        async def one(key, k, after, start):
            await asyncio.sleep(after)
            k['attempts'] = await operation(
                k['ports'], '/%s/pay' % k['policy'], key, k['body'],
                ATTEMPTS, random.Random(key), start)

        tasks, samples, probers = [], {}, []
        for target in targets:
            ports = self.ports_of(target)
            for policy in policies:
                for i in range(per):
                    key = '%s-%s-%s-%d' % (tag, target, policy, i)
                    keys[key] = {'policy': policy, 'target': target,
                                 'ports': ports, 'body': json.dumps(
                                     {'amount': 100 + i}).encode()}
                    tasks.append(one(key, keys[key], rng.random() * spread,
                                     i % 2))
            samples[target] = []
            probers.append(asyncio.ensure_future(self.prober(
                ports, samples[target], '%s-%s' % (tag, target))))
        fault = rnd.get('fault')
        results = await asyncio.gather(
            fault(self, t0) if fault else asyncio.sleep(0), *tasks)
        window = results[0] if fault else None
        for p in probers:
            p.cancel()

        # every lease of a dead owner has ended: a probe per key
        last = max(a['t1'] for k in keys.values() for a in k['attempts'])
        await asyncio.sleep(max(0.0, last + LOST_AFTER + 0.5 - time.time()))
        probes = await asyncio.gather(*(
            post(k['ports'][0], '/%s/pay' % k['policy'], key, k['body'],
                 extra=b'X-Probe: 1\r\n') for key, k in keys.items()))
        for (key, k), p in zip(keys.items(), probes):
            k['probe'] = p
        await asyncio.sleep(0.3)

        events = self.origin_events(tag)
        for target in targets:
            label, wait = TARGETS[target]
            mine = {k: v for k, v in keys.items() if v['target'] == target}
            r = dict(rnd, target=target, label=label, policies=policies,
                     window=window, allow_twice=(wait == 1), lease=LEASE)
            rows, failing = judge.judge_round(r, mine, events,
                                              samples[target])
            for row in rows:
                row['seconds'] = round(time.time() - t0, 1)
                print('  %-20s %-16s %s' % (
                    label, row['policy'], 'pass' if row['ok'] else
                    'FAIL (%d keys)' % row['problems']), flush=True)
            self.rows += rows
            for key, problems in failing:
                self.report_key(name, key, keys.get(key),
                                events.get(key, []), problems)

    def origin_events(self, tag):
        by_key = {}
        with open(self.origin_log) as f:
            for line in f:
                e = json.loads(line)
                if e.get('key', '').startswith(tag + '-'):
                    by_key.setdefault(e['key'], []).append(e)
        return by_key

    def report_key(self, rnd, key, k, events, problems):
        self.failing.append({'round': rnd, 'key': key,
                             'problems': problems})
        print('  FAIL %s: %s' % (key, '; '.join(problems)), flush=True)
        if k is None:
            return
        text = timeline.key_timeline(
            key, k, events, [(e.name, e.dir) for e in self.edges],
            timeline.monitor_files(set(self.nodes.values())),
            self.names.addr)
        d = os.path.join(self.out, 'timelines')
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, key + '.txt'), 'w') as f:
            f.write('%s\n%s\n\n%s\n' % (key, '\n'.join(problems), text))
        if len(self.failing) <= 3:
            print('\n'.join('    ' + x for x in text.splitlines()[:60]))

    # -------------------------------------------------------- the real SDK

    async def stripe_round(self):
        """One round with Stripe's own Node library (npm `stripe`)."""
        import stripe_round
        await stripe_round.run(self)

    # -------------------------------------------------------- all of it

    async def main(self):
        bg = [asyncio.ensure_future(self.names.run())]
        bg += [asyncio.ensure_future(timeline.monitor(
            p, os.path.join(d, 'monitor-%d.log' % p)))
            for p, d in self.nodes.items()]
        t0 = time.time()
        only = self.args.rounds and self.args.rounds.split(',')
        for rnd in ROUNDS:
            if self.short and not rnd.get('short'):
                continue
            if only and rnd['name'] not in only:
                continue
            if rnd.get('targets') == SENTINEL and not self.sentinel:
                continue
            await self.round(rnd)
        if not self.short and (not only or 'stripe-sdk' in only):
            await self.stripe_round()
        for t in bg:
            t.cancel()
        self.seconds = time.time() - t0


def write_doc(path, rows, seconds):
    """Replaces the generated part of docs/faults.md, between markers."""
    with open(path) as f:
        doc = f.read()
    begin, end = '<!-- begin: generated by make faults -->', \
        '<!-- end: generated by make faults -->'
    passed = sum(r['ok'] for r in rows)
    gen = '%s\n%s\n\n%d passed, %d failed, in %d s on %s.\n%s' % (
        begin, judge.table(rows), passed, len(rows) - passed, seconds,
        time.strftime('%Y-%m-%d'), end)
    doc = re.sub(re.escape(begin) + '.*?' + re.escape(end), lambda m: gen,
                 doc, flags=re.S)
    with open(path, 'w') as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--short', action='store_true')
    ap.add_argument('--rounds')
    ap.add_argument('--out', default=os.path.join(TOP, 'build/faults'))
    ap.add_argument('--doc')
    args = ap.parse_args()
    if args.rounds and args.doc:
        ap.error('--doc takes the whole campaign, not --rounds')
    c = Campaign(args)
    # a SIGTERM (a test runner's timeout) still stops what we started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    try:
        c.setup()
        asyncio.run(c.main())
    finally:
        c.teardown()
    judge.dump(os.path.join(c.out, 'results.json'), c.rows, c.failing)
    print()
    print(judge.table(c.rows))
    if args.doc:
        write_doc(args.doc, c.rows, c.seconds)
    passed = sum(r['ok'] for r in c.rows)
    print('\n%d passed, %d failed' % (passed, len(c.rows) - passed))
    sys.exit(0 if passed == len(c.rows) else 1)


if __name__ == '__main__':
    main()
