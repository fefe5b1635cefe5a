"""The checker: judges every key of a round against what the origin ran.

Per key:
  - executions <= 1 where they must be (keep; forward against the
    deduplicating origin); more are counted as expected re-executions
    under release and forward-nodedup;
  - the client's final answer is the response of an execution of the key
    (byte for byte), or outcome-unknown where the origin saw a request of
    the key (it may have run), or a retryable error (409, 503, 502/504,
    network) where nothing ran;
  - a probe sent once the round is over and every lease has ended is a
    final answer too (never 409 or 503: nothing stays stuck), and under a
    deduplicating policy it is the same bytes as the client's answer.
"""

import json

DEDUP = ('keep', 'forward')     # executions <= 1 per key


def classify(r, commits):
    """The kind of one answer: new, replay, unknown, retry-later, wrong."""
    s, body = r['status'], r['body']
    if s == 0:
        return 'retry-later'                 # network error
    if s in (502, 504) and b'"code":"outcome-unknown"' in body:
        return 'unknown'
    for c in commits:
        if s == c['status'] and body == c['body'].encode():
            replayed = r['headers'].get('x-idem') == 'replay' or \
                r['headers'].get('idempotent-replayed') == 'true'
            return 'replay' if replayed else 'new'
    if s in (409, 503, 502, 504):
        return 'retry-later'
    return 'wrong'


def describe(r):
    h = r['headers']
    return '%.3f-%.3f port %d: %s %s %s %s' % (
        r['t0'], r['t1'], r['port'], r['status'] or r['error'],
        h.get('x-idem', '-'), h.get('x-edge', '-'),
        r['body'][:90].decode('latin-1').strip())


def judge_key(key, k, events, rnd):
    """-> (facts, problems): what happened to the key, what is wrong."""
    policy = k['policy']
    commits = [e for e in events if e['ev'] == 'commit']
    in_round = [c for c in commits if not c['probe']]
    seen = [e for e in events if e['ev'] == 'arrive' and not e['probe']]
    net_err = any(a['status'] == 0 for a in k['attempts'])
    # a claim left while Redis was out of reach: its attempt got 503 or
    # no answer within a lease before the end of the outage
    w = rnd.get('window')
    stranded = w and w[1] and any(
        a['status'] in (0, 503) and w[0] - rnd['lease'] <= a['t0'] <= w[1]
        for a in k['attempts'])
    final = classify(k['attempts'][-1], commits)
    probe = classify(k['probe'], commits) if k.get('probe') else None
    problems = []

    if policy in DEDUP and len(commits) > 1 and not rnd.get('allow_twice'):
        problems.append('ran %d times under %s' % (len(commits), policy))

    def unknown_ok(what):
        if seen:
            return
        # allowed where the round kills owners (an owner that died may
        # have run the request: its client saw the connection go), or
        # keeps Redis out of reach longer than a lease (a claim whose
        # release could not be delivered before its lease ended)
        loss = rnd.get('owner_loss')
        if (loss == 'killed' and net_err) or (loss == 'outage' and stranded):
            return
        problems.append('%s: outcome-unknown, but the origin never saw the '
                        'key' % what)

    for what, kind in (('final answer', final), ('probe', probe)):
        if kind == 'unknown':
            unknown_ok(what)
        elif kind == 'wrong':
            problems.append('%s is no execution\'s response' % what)
    if final == 'retry-later' and in_round:
        problems.append('final answer is retry-later (%s), though it ran'
                        % (k['attempts'][-1]['status'] or 'network error'))
    if probe == 'retry-later':
        problems.append('stuck: the probe after recovery got %s'
                        % (k['probe']['status'] or 'a network error'))
    if policy in DEDUP and not rnd.get('allow_twice') \
            and final in ('new', 'replay') \
            and probe in ('new', 'replay') \
            and k['probe']['body'] != k['attempts'][-1]['body']:
        problems.append('the probe\'s replay differs from the answer')
    facts = {'executions': len(commits), 'in_round': len(in_round),
             'final': final, 'probe': probe, 'seen': len(seen),
             'never_ran': final == 'unknown' and not commits}
    return facts, problems


def recovery(samples, window):
    """Seconds from the fault's end until the prober's requests succeed
    again on every edge; None for faults without an end (the origin's)."""
    if not window or window[1] is None:
        return None
    start, end = window
    worst = 0.0
    for port in sorted({s['port'] for s in samples}):
        mine = [s for s in samples if s['port'] == port and s['t0'] >= start]
        fails = [s for s in mine if s['status'] != 200]
        if not fails:
            continue
        last = max(s['t0'] for s in fails)
        ok = [s['t1'] for s in mine if s['status'] == 200 and s['t0'] > last]
        worst = max(worst, (min(ok) if ok else mine[-1]['t1']) - end)
    return max(worst, 0.0)


def judge_round(rnd, keys, events_by_key, samples):
    """-> rows (one per policy) and the failing keys with their reasons."""
    rows, failing = [], []
    rec = recovery(samples, rnd.get('window'))
    for policy in rnd['policies']:
        mine = {k: v for k, v in keys.items() if v['policy'] == policy}
        row = {'fault': rnd['name'], 'redis': rnd['label'],
               'policy': policy, 'keys': len(mine), 'executions': 0,
               'twice': 0, 'new': 0, 'replay': 0, 'unknown': 0,
               'retry-later': 0, 'wrong': 0, 'stuck': 0, 'never_ran': 0,
               'recover': rec, 'problems': 0}
        for key, k in sorted(mine.items()):
            facts, problems = judge_key(key, k, events_by_key.get(key, []),
                                        rnd)
            row['executions'] += facts['executions']
            row['twice'] += facts['executions'] > 1
            row[facts['final']] += 1
            row['stuck'] += facts['probe'] == 'retry-later'
            row['never_ran'] += facts['never_ran']
            if problems:
                row['problems'] += 1
                failing.append((key, problems))
        need = rnd.get('must_rerun', {}).get(policy)
        row['ok'] = row['problems'] == 0 and \
            (not need or row['twice'] >= 1)
        if need and row['twice'] < 1:
            failing.append(('(%s %s)' % (rnd['name'], policy),
                            ['expected at least one re-execution: ' + need]))
        rows.append(row)
    return rows, failing


COLUMNS = ('fault', 'redis', 'policy', 'keys', 'executions', 'twice', 'new',
           'replay', 'unknown', 'retry-later', 'wrong', 'stuck', 'recover',
           'check')
HEAD = ('fault', 'Redis', 'policy', 'keys', 'executions', 'keys run twice',
        'new', 'replay', 'outcome-unknown', 'retry later', 'wrong', 'stuck',
        'recovery (s)', 'check')


def table(rows):
    out = ['| ' + ' | '.join(HEAD) + ' |',
           '|' + '---|' * len(HEAD)]
    for r in rows:
        cells = []
        for c in COLUMNS:
            v = r.get(c)
            if c == 'recover':
                v = '—' if v is None else '%.2f' % v
            elif c == 'check':
                v = 'pass' if r['ok'] else '**FAIL**'
            elif c == 'unknown' and r['never_ran']:
                v = '%d (%d never ran)' % (v, r['never_ran'])
            cells.append(str(v))
        out.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(out)


def dump(path, rows, failing):
    with open(path, 'w') as f:
        json.dump({'rows': rows, 'failing': failing}, f, indent=1)
