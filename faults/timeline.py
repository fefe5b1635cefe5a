"""The timeline of one key, for a key the checker failed: what each client
attempt got, what each nginx logged (which edge, which worker), what the
origin ran, and what Redis was sent (MONITOR), each Redis connection named
by the worker that opened it (CLIENT SETNAME nginx-idempotency-PID)."""

import asyncio
import glob
import json
import os
import re
import time


class Names:
    """Samples CLIENT LIST on every node: Redis connection -> worker pid."""

    def __init__(self, ports):
        self.ports, self.addr = ports, {}

    async def sample(self, port):
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection('127.0.0.1', port), 0.3)
            w.write(b'CLIENT LIST\r\n')
            n = int((await asyncio.wait_for(r.readline(), 0.3))[1:])
            data = await asyncio.wait_for(r.readexactly(n + 2), 0.3)
            w.close()
        except (OSError, ValueError, asyncio.TimeoutError,
                asyncio.IncompleteReadError):
            return
        for line in data.decode('latin-1').splitlines():
            f = dict(x.split('=', 1) for x in line.split(' ') if '=' in x)
            if f.get('name', '').startswith('nginx-idempotency-'):
                self.addr[f['addr']] = 'pid ' + f['name'].rsplit('-', 1)[1]

    async def run(self):
        while True:
            await asyncio.gather(*(self.sample(p) for p in self.ports))
            await asyncio.sleep(0.3)


async def monitor(port, path):
    """MONITOR of one node into path, line by line (a killed redis-cli
    would lose its buffered tail), connecting again after a restart."""
    with open(path, 'a', buffering=1, encoding='latin-1') as f:
        while True:
            try:
                r, w = await asyncio.open_connection('127.0.0.1', port)
                w.write(b'MONITOR\r\n')
                while True:
                    line = await r.readline()
                    if not line:
                        break
                    if line.startswith(b'+') and line[1:3] != b'OK':
                        f.write(line[1:].decode('latin-1').rstrip('\r\n')
                                + '\n')
                w.close()
            except OSError:
                pass
            await asyncio.sleep(0.1)


ESC = {'n': b'\n', 'r': b'\r', 't': b'\t', 'a': b'\a', 'b': b'\b',
       '"': b'"', '\\': b'\\'}


def unquote(s):
    """redis-cli's quoted string -> bytes."""
    out, i = b'', 0
    while i < len(s):
        c = s[i]
        if c == '\\' and i + 1 < len(s):
            n = s[i + 1]
            if n == 'x':
                out += bytes([int(s[i + 2:i + 4], 16)])
                i += 4
                continue
            out += ESC.get(n, n.encode())
            i += 2
            continue
        out += c.encode('latin-1')
        i += 1
    return out


def record(v):
    """A record value in a few words: state, owner, lease or unknown."""
    if not v.startswith(b'IDM1') or len(v) < 53:
        return '%d bytes' % len(v) if len(v) > 24 else repr(v)
    state = {1: 'CLAIM', 2: 'DONE', 3: 'TOO_LARGE', 4: 'DONE+T'}.get(
        v[4], 'state %d' % v[4])
    owner = v[37:45].hex()
    if v[4] != 1:
        return '%s owner %s (%d bytes)' % (state, owner, len(v))
    if v[45] != 0xC1:
        return 'CLAIM format 1'
    word = v[47:53]
    if v[46] == ord('L'):
        d = int.from_bytes(word, 'big') / 1000
        return 'CLAIM lease owner %s until %s' % (owner, clock(d))
    return 'CLAIM unknown owner %s cause %d status %d' % (
        owner, word[0], word[1] << 8 | word[2])


def clock(t):
    return time.strftime('%H:%M:%S', time.localtime(t)) + '.%03d' % (
        int(t * 1000) % 1000)


ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def monitor_lines(paths, rkey, names):
    out = []
    for path in paths:
        node = os.path.basename(path)
        try:
            lines = open(path, encoding='latin-1').read().splitlines()
        except OSError:
            continue
        for line in lines:
            if rkey not in line:
                continue
            m = re.match(r'(\d+\.\d+) \[(\S+) ?(\S*)\] (.*)', line)
            if not m:
                continue
            t, who = float(m.group(1)), m.group(3) or m.group(2)
            args = [unquote(a) for a in ARG.findall(m.group(4))]
            shown = []
            for i, a in enumerate(args[:8]):
                renewal = (i == 3 and args[0] == b'SETRANGE'
                           and args[2] == b'47') or \
                    (len(a) == 6 and len(args[i - 1]) == 47)
                if rkey in a.decode('latin-1'):
                    shown.append('KEY')
                elif renewal:
                    # the lease's new deadline
                    shown.append('<until %s>' % clock(
                        int.from_bytes(a, 'big') / 1000))
                elif a.startswith(b'IDM1') and len(a) == 47:
                    shown.append('<lease of owner %s>' % a[37:45].hex())
                elif a.startswith(b'IDM1'):
                    shown.append('<' + record(a) + '>')
                elif len(a) > 40:
                    shown.append('<%d bytes>' % len(a))
                else:
                    shown.append(a.decode('latin-1'))
            out.append((t, 'redis %s %s: %s' % (
                node, names.get(who, who), ' '.join(shown))))
    return out


def key_timeline(key, k, events, edges, monitors, names, extra=()):
    """-> text: every event about the key, in time order."""
    rows = []
    for i, a in enumerate(k['attempts'] + ([k['probe']] if k.get('probe')
                                           else [])):
        what = 'probe' if a is k.get('probe') else 'attempt %d' % (i + 1)
        h = a['headers']
        rows.append((a['t0'], 'client %s -> port %d' % (what, a['port'])))
        rows.append((a['t1'], 'client %s <- %s idem=%s edge=%s %s' % (
            what, a['status'] or a['error'], h.get('x-idem', '-'),
            h.get('x-edge', '-'),
            a['body'][:100].decode('latin-1').strip())))
    for e in events:
        rows.append((e['t'], 'origin %s %s' % (e['ev'], json.dumps(
            {x: y for x, y in e.items() if x not in ('t', 'ev', 'key')}))))
    hashes = set()
    for name, d in edges:
        for line in open(os.path.join(d, 'logs/faults.log'),
                         encoding='latin-1'):
            if key in line:
                a = json.loads(line)
                hashes.add(a['hash'])
                rows.append((a['t'], 'nginx %s pid %s: %s %s up=%s rt=%s' % (
                    name, a['pid'], a['status'], a['idem'], a['up'],
                    a['rt'])))
    for name, d in edges:
        for h in hashes - {''}:
            for line in open(os.path.join(d, 'logs/error.log'),
                             encoding='latin-1'):
                if h in line:
                    t = time.mktime(time.strptime(line[:19],
                                                  '%Y/%m/%d %H:%M:%S'))
                    # to the second: after what happened in that second
                    rows.append((t + 0.999, 'nginx %s error.log at %s: %s'
                                 % (name, line[11:19],
                                    line[20:].strip()[:300])))
    for h in hashes - {''}:
        rows += monitor_lines(monitors, '{%s}' % h, names)
    rows += list(extra)
    rows.sort(key=lambda r: r[0])
    return '\n'.join('%s  %s' % (clock(t), text) for t, text in rows)


def monitor_files(dirs):
    out = []
    for d in dirs:
        out += sorted(glob.glob(os.path.join(d, 'monitor*.log')))
    return out
