#!/usr/bin/env python3
"""util/layers.py: fails when src/ breaks its layers (docs/design.md, "The
layers").  From the top down: the module's wiring (src/*.c), http/ (the
request), store/ (the protocol over Redis, knowing no request), redis/ (the
client, knowing no idempotency).  A file may use its own layer and the ones
below, never one above:

  1. it includes no header of a higher layer;
  2. it names no function or variable that a higher layer defines;
  3. redis/ and store/ never see a request: no ngx_http_request_t, no
     <ngx_http.h>, no http configuration (ngx_http_conf_get_*,
     ngx_http_core_*), no loc conf or request ctx of the module;
  4. a topology is a table of functions: outside the topologies' own files
     (sentinel*.c, cluster*.c), no code asks which topology a target is
     (->seeds, ->sentinel) to decide what to do;
  5. the record's bytes are the store's: outside store/, no code names the
     format's internals (the magic, the owner's length, the lease mark) or
     a head's byte offsets; it reads a record through store.h's accessors
     and writes one through build.c;
  6. the store is the only way to Redis from the request: no http/ or
     wiring code reads a reply's fields (reply->..., REDIS_REPLY_*) or
     sends a command of the client's (op_alloc, redis_command);
  7. small files with one concern: no source file over 1,000 lines, no
     function over 150 (from the line that names it to its closing
     brace, nginx style).

Comments and string literals are not read.  Prints one line per breach and
exits 1; prints a summary and exits 0 when the layers hold.

Usage: util/layers.py [SRC]   (default: the src/ beside this script)
"""

import os
import re
import sys

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')

LAYERS = ('redis', 'store', 'http', 'module')
TOPOLOGIES = ('redis/ngx_http_idempotency_sentinel.c',
              'redis/ngx_http_idempotency_sentinel_conf.c',
              'redis/ngx_http_idempotency_cluster.c',
              'redis/ngx_http_idempotency_cluster_map.c')

REQUEST = re.compile(r'ngx_http_request_t|<ngx_http\.h>|ngx_http_conf_get_'
                     r'|ngx_http_core_|ngx_http_idempotency_(?:loc|main)_conf_t'
                     r'|ngx_http_idempotency_ctx_t')
# the module object, which nginx's API takes to find a request's ctx and
# the confs, and the version string are every layer's to name
SHARED = ('ngx_http_idempotency_module', 'ngx_http_idempotency_version.h')

TOPOLOGY = re.compile(r'(?:redis|\])->(?:seeds|sentinel)\b')
RAW = re.compile(r'\breply->|\bREDIS_REPLY_\w+'
                 r'|\bngx_http_idempotency_(?:op_alloc|redis_command)\b')
FORMAT = re.compile(r'NGX_HTTP_IDEMPOTENCY_(?:MAGIC|OWNER_LEN|LEASE_MARK)\b'
                    r'|(?<!\.)\b(?:claim|seen|head|value|rec|data)'
                    r'\s*(?:\[\s*4\s*\]|\+\s*5\b)')
FUNC = re.compile(r'^(ngx_http_idempotency_\w+)\(', re.M)
FILE_MAX = 1000
FUNC_MAX = 150
VAR = re.compile(r'^(?!static|extern|typedef)[a-z_][\w ]*[ *]'
                 r'(ngx_http_idempotency_\w+)(?:\[[^]]*\])? *[=;]', re.M)
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def rank(path):
    head = path.split('/')[0]
    return LAYERS.index(head) if head in LAYERS[:3] else 3


def strip(text):
    """Comments and string literals become blanks; lines stay in place."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(c + ' ' * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def main():
    # util/layers.py [SRC]: another tree than the project's src/ (t/052)
    top = sys.argv[1] if len(sys.argv) > 1 else TOP
    files = {}
    for root, _, names in os.walk(top):
        for name in names:
            if name.endswith(('.c', '.h')):
                path = os.path.relpath(os.path.join(root, name), top)
                with open(os.path.join(root, name), encoding='utf-8') as f:
                    raw = f.read()
                files[path.replace(os.sep, '/')] = raw

    breaches = []
    headers = {os.path.basename(p): rank(p) for p in files if p.endswith('.h')}

    # 1. includes
    for path, raw in sorted(files.items()):
        for m in INCLUDE.finditer(raw):
            h = m.group(1)
            if h not in SHARED and headers.get(h, -1) > rank(path):
                line = raw.count('\n', 0, m.start()) + 1
                breaches.append('%s:%d includes %s, a higher layer\'s header'
                                % (path, line, h))

    # 2. names a higher layer defines (nginx style: a definition's name
    # starts its line, and "static" on the line before keeps it private)
    defs = {}
    code = {p: strip(raw) for p, raw in files.items()}
    for path, text in code.items():
        if not path.endswith('.c'):
            continue
        lines = text.split('\n')
        for i, line in enumerate(lines):
            m = FUNC.match(line)
            if m and not (i and lines[i - 1].startswith('static')):
                defs.setdefault(m.group(1), path)
        for m in VAR.finditer(text):
            defs.setdefault(m.group(1), path)

    for path, text in sorted(code.items()):
        r = rank(path)
        body = re.sub(r'^#include.*$', '', text, flags=re.M)
        for word in sorted(set(re.findall(r'\bngx_http_idempotency_\w+', body))):
            where = defs.get(word)
            if where and rank(where) > r and word not in SHARED:
                breaches.append('%s names %s, which %s (a higher layer) '
                                'defines' % (path, word, where))

    # 3. the lower layers see no request; 4. no topology tests; 5. no
    # record bytes outside the store; 6. no reply or client call above it
    for path, text in sorted(code.items()):
        for n, line in enumerate(text.split('\n'), 1):
            if rank(path) <= 1 and REQUEST.search(line):
                breaches.append('%s:%d sees the request: %s'
                                % (path, n, line.strip()))
            if path not in TOPOLOGIES and TOPOLOGY.search(line):
                breaches.append('%s:%d asks the topology: %s'
                                % (path, n, line.strip()))
            if rank(path) >= 2 and RAW.search(line):
                breaches.append('%s:%d reads Redis past the store: %s'
                                % (path, n, line.strip()))
            if rank(path) != 1 and FORMAT.search(line):
                breaches.append('%s:%d reads a record\'s bytes: %s'
                                % (path, n, line.strip()))

    # 7. sizes
    for path, raw in sorted(files.items()):
        lines = raw.split('\n')
        if len(lines) - 1 > FILE_MAX:
            breaches.append('%s has %d lines, more than %d'
                            % (path, len(lines) - 1, FILE_MAX))
        start = None
        for n, line in enumerate(lines, 1):
            if start is None and FUNC.match(line):
                start, name = n, FUNC.match(line).group(1)
            elif start is not None and line == '}':
                if n - start + 1 > FUNC_MAX:
                    breaches.append('%s:%d %s has %d lines, more than %d'
                                    % (path, start, name, n - start + 1,
                                       FUNC_MAX))
                start = None

    for b in breaches:
        print('layers: ' + b)

    if breaches:
        print('layers: %d breaches in %d files' % (len(breaches), len(files)))
        return 1

    print('layers: %d files, %d exported names, nothing calls up the stack'
          % (len(files), len(defs)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
