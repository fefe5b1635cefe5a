"""The round with Stripe's own Node library (npm `stripe`), pointed at the
edges as its API host, against an origin that times out or answers 500
after it ran.  The package is installed at run time into a cache outside
the repository ($STRIPE_NODE_DIR, as for t/047, else
/var/cache/ngx-idempotency-npm, else ~/.cache/ngx-idempotency-npm);
without node and npm the round is skipped with a message."""

import asyncio
import json
import os
import shutil
import subprocess

import judge

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = 'stripe@23.1.0'        # the version t/047 tests
KEYS = 16


def npm_dir():
    for d in (os.environ.get('STRIPE_NODE_DIR'),
              '/var/cache/ngx-idempotency-npm',
              os.path.expanduser('~/.cache/ngx-idempotency-npm')):
        if not d:
            continue
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    return None


def install():
    """-> node_modules of a cache with the package, or why not."""
    if not shutil.which('node') or not shutil.which('npm'):
        return None, 'node or npm is not installed'
    d = npm_dir()
    if d is None:
        return None, 'no writable cache directory for npm'
    mods = os.path.join(d, 'node_modules')
    if not os.path.exists(os.path.join(mods, 'stripe', 'package.json')):
        out = subprocess.run(['npm', 'install', '--prefix', d, '--no-audit',
                              '--no-fund', '--silent', PACKAGE],
                             capture_output=True, text=True, timeout=300)
        if out.returncode:
            return None, 'npm install %s failed: %s' % (
                PACKAGE, out.stderr.strip()[-300:])
    return mods, None


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
    print('round %s (Redis direct, npm %s)' % (name, PACKAGE), flush=True)
    mods, why = await asyncio.to_thread(install)
    if mods is None:
        print('  skipped: %s' % why, flush=True)
        c.notes.append('%s skipped: %s' % (name, why))
        return
    tag = '%s-%s' % (c.run, name)
    await c.control(modes=['timeout', 'err500'], rate=0.8, delay=0.05,
                    late=1.6, seed=99)
    keys = ['%s-keep-%d' % (tag, i) for i in range(KEYS)]
    ports = c.ports_of('direct')
    proc = await asyncio.create_subprocess_exec(
        'node', os.path.join(HERE, 'stripe-round.js'), str(ports[0]),
        str(ports[1]), *keys, stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, NODE_PATH=mods))
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
