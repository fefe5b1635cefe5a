"""The round with Stripe's own Node library (npm `stripe`), pointed at the
edges as its API host, against an origin that times out or answers 500
after it ran.  The library is driven by t/lib/stripe_client.js, as in
t/047, which installs it at run time into a cache outside the repository;
without node and npm the round is skipped with a message."""

import asyncio
import json
import os
import shutil
import subprocess

import judge

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(os.path.dirname(HERE), 't/lib/stripe_client.js')
KEYS = 16


def install():
    """-> the library's name and version, and why not when it is not."""
    if not shutil.which('node'):
        return None, 'node is not installed'
    out = subprocess.run(['node', CLIENT, 'install'], capture_output=True,
                         text=True, timeout=330)
    if out.returncode:
        return None, out.stderr.strip()[-300:]
    return out.stdout.strip(), None


def attempt_of(o, commits):
    """What the library handed back, as judge.classify reads an answer."""
    h = {k.lower(): v for k, v in (o.get('headers') or {}).items()}
    a = {'t0': o['t0'], 't1': o['t1'], 'port': 0, 'status': o['status'],
         'headers': h, 'error': o.get('error', ''), 'body': b''}
    if o['resolved']:
        a['body'] = (o['body'] + '\n').encode()
    elif o.get('charge'):
        # an API error carrying a charge: the execution's own 500
        for c in commits:
            if o['charge'] in c['body']:
                a['body'] = c['body'].encode()
    else:
        # an error the module made (its problem's "error" member)
        a['body'] = json.dumps({'code': o.get('code'),
                                'message': o.get('message')},
                               separators=(',', ':')).encode()
    return a


async def run(c):
    name = 'stripe-sdk'
    package, why = await asyncio.to_thread(install)
    print('round %s (Redis direct, npm %s)' % (name, package or 'stripe'),
          flush=True)
    if package is None:
        print('  skipped: %s' % why, flush=True)
        c.notes.append('%s skipped: %s' % (name, why))
        return
    tag = '%s-%s' % (c.run, name)
    await c.control(modes=['timeout', 'err500'], rate=0.8, delay=0.05,
                    late=1.6, seed=99)
    keys = ['%s-keep-%d' % (tag, i) for i in range(KEYS)]
    # even keys to the first edge, odd keys to the second
    proc = await asyncio.create_subprocess_exec(
        'node', CLIENT, '--timeout', '5000',
        ','.join(map(str, c.ports_of('direct'))),
        *('%s:%d' % (k, 1000 + i) for i, k in enumerate(keys)),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    await asyncio.sleep(0.3)
    events = c.origin_events(tag)
    got = {}
    for line in out.decode().splitlines():
        o = json.loads(line)
        commits = [e for e in events.get(o['key'], [])
                   if e['ev'] == 'commit']
        got[o['key']] = {'policy': 'keep', 'sdk': o,
                         'attempts': [attempt_of(o, commits)]}
    rnd = {'name': name, 'label': 'standalone', 'policies': ['keep']}
    rows, failing = judge.judge_round(rnd, got, events, [])
    if len(got) != KEYS:
        failing.append(('(%s)' % name, ['node printed %d of %d keys'
                                        % (len(got), KEYS)]))
        rows[0]['ok'] = False
    # the library returns a JSON body without an "error" member as the
    # call's result, whatever the status: outcome-unknown must be thrown
    unknown = [k for k in got.values() if k['sdk']['resolved']
               and b'"outcome-unknown"' in k['attempts'][0]['body']]
    if unknown:
        failing.append(('(%s)' % name, [
            '%d outcome-unknown answers returned as results, not thrown'
            % len(unknown)]))
        rows[0]['ok'] = False
    c.notes.append('%s: %d of %d outcome-unknown answers thrown by the '
                   'library as errors' % (name, rows[0]['unknown']
                                          - len(unknown), rows[0]['unknown']))
    print('  ' + c.notes[-1], flush=True)
    for r in rows:
        print('  %-16s %s' % (r['policy'], 'pass' if r['ok'] else
                              'FAIL (%d keys)' % r['problems']), flush=True)
    c.rows += rows
    for key, problems in failing:
        c.report_key(name, key, None, events.get(key, []), problems)
