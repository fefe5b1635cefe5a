"""The processes of the fault campaign: Redis (standalone with AOF, or the
Sentinel topology of util/topology.sh), the origin, the cut proxy and two
nginx instances.  Each one is stopped by the process that started it."""

import asyncio
import os
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
# as util/redis.sh and util/topology.sh: Valkey's binaries, or Redis's
SERVER = os.environ.get('REDIS_SERVER', 'redis-server')
CLI = os.environ.get('REDIS_CLI', 'redis-cli')


def wait_for(cond, secs, what):
    end = time.time() + secs
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError('timed out waiting for ' + what)


def cli(port, *args, timeout=5):
    """redis-cli PORT ARGS -> its output, '' when Redis does not answer."""
    try:
        out = subprocess.run([CLI, '-p', str(port)] + list(args),
                             capture_output=True, text=True, timeout=timeout)
        return out.stdout.strip()
    except subprocess.TimeoutExpired:
        return ''


class Redis:
    """A standalone Redis that survives kill -9: AOF, appendfsync always."""

    def __init__(self, port, d):
        self.port, self.dir, self.proc = port, d, None
        os.makedirs(d, exist_ok=True)

    def start(self):
        log = open(os.path.join(self.dir, 'redis.log'), 'a')
        self.proc = subprocess.Popen(
            [SERVER, '--port', str(self.port), '--bind', '127.0.0.1',
             '--save', '', '--appendonly', 'yes', '--appendfsync', 'always',
             '--dir', self.dir, '--enable-debug-command', 'yes'],
            stdout=log, stderr=log)
        log.close()
        wait_for(lambda: cli(self.port, 'PING', timeout=1) == 'PONG', 10,
                 'redis on %d' % self.port)

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def kill9(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait()


class Topology:
    """util/topology.sh sentinel: 1 master, 2 replicas, 3 Sentinels."""

    def __init__(self, base, d):
        self.env = dict(os.environ, TOPO_BASE=str(base), TOPO_DIR=d)
        self.data = [base + 31, base + 32, base + 33]
        self.sentinels = [base + 41, base + 42, base + 43]
        self.dir = d
        self.up = False

    def run(self, *args):
        out = subprocess.run([os.path.join(TOP, 'util/topology.sh')]
                             + list(args), env=self.env, capture_output=True,
                             text=True, timeout=120)
        if out.returncode:
            raise RuntimeError('topology.sh %s: %s' % (' '.join(args),
                                                       out.stderr.strip()))
        return out.stdout.strip()

    async def action(self, *args):
        return await asyncio.to_thread(self.run, *args)

    def start(self):
        self.up = True
        return self.run('up', 'sentinel')

    def restart(self, port):
        """A killed data node started again from its configuration; the
        Sentinels make it a replica of the master, and it syncs."""
        subprocess.run([SERVER, os.path.join(self.dir, str(port),
                                              'redis.conf')],
                       check=True, stdout=subprocess.DEVNULL)
        wait_for(lambda: 'master_link_status:up' in cli(
            port, 'INFO', 'replication', timeout=1), 30,
            'redis %d to sync as a replica' % port)

    def stop(self):
        if self.up:
            self.run('down', 'sentinel')
            self.up = False


class Proc:
    """A Python helper of ours (the origin) in the background."""

    def __init__(self, args, log):
        self.args, self.log, self.proc = args, log, None

    def start(self):
        f = open(self.log, 'a')
        self.proc = subprocess.Popen(['python3'] + self.args, stdout=f,
                                     stderr=f)
        f.close()

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


class CutProxy(Proc):
    """The cut proxy of the tests (t/lib/cutproxy.py), driven through its
    standard input: command(line) returns once the line is in force."""

    def __init__(self, port, redis_port, cuts, log):
        super().__init__([os.path.join(TOP, 't/lib/cutproxy.py'), str(port),
                          str(redis_port), cuts], log)

    def start(self):
        f = open(self.log, 'a')
        self.proc = subprocess.Popen(['python3'] + self.args,
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=f,
                                     text=True)
        f.close()
        self.expect('ready')

    def expect(self, want):
        line = self.proc.stdout.readline().strip()
        if line != want:
            raise RuntimeError('the cut proxy said %r, not %r'
                               % (line or '(nothing)', want))

    def command(self, line):
        self.proc.stdin.write(line + '\n')
        self.proc.stdin.flush()
        self.expect('ok')


class Nginx:
    """One nginx (a master, its workers) in its own prefix directory."""

    def __init__(self, name, d, binary, conf):
        self.name, self.dir, self.bin = name, d, binary
        for sub in ('conf', 'logs'):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, 'conf/nginx.conf'), 'w') as f:
            f.write(conf)
        self.started = False

    def cmd(self, *args):
        return subprocess.run([self.bin, '-p', self.dir + '/', '-c',
                               'conf/nginx.conf'] + list(args),
                              capture_output=True, text=True, timeout=30)

    def start(self):
        out = self.cmd()
        if out.returncode:
            raise RuntimeError('nginx %s: %s' % (self.name, out.stderr))
        self.started = True

    def master(self):
        with open(os.path.join(self.dir, 'logs/nginx.pid')) as f:
            return int(f.read())

    def workers(self):
        """pids of the master's live workers (not the shutting-down ones)."""
        master, pids = self.master(), []
        for p in os.listdir('/proc'):
            if not p.isdigit():
                continue
            try:
                with open('/proc/%s/stat' % p) as f:
                    ppid = int(f.read().rsplit(')', 1)[1].split()[1])
                with open('/proc/%s/cmdline' % p, 'rb') as f:
                    cmdline = f.read()
            except (OSError, IndexError, ValueError):
                continue
            if ppid == master and b'worker process' in cmdline \
                    and b'shutting down' not in cmdline:
                pids.append(int(p))
        return pids

    def reload(self):
        return self.cmd('-s', 'reload').returncode == 0

    def stop(self):
        if not self.started:
            return
        self.cmd('-s', 'quit')
        pidfile = os.path.join(self.dir, 'logs/nginx.pid')
        try:
            wait_for(lambda: not os.path.exists(pidfile), 15, 'nginx quit')
        except RuntimeError:
            self.cmd('-s', 'stop')
        self.started = False
