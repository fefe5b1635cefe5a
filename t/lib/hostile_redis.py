#!/usr/bin/env python3
"""A hostile Redis for t/057-hostile-redis.t: it answers the module's
handshake as Redis would (CLIENT SETNAME, SELECT, INFO server, SCRIPT LOAD,
PING), then answers every other command (the claim: SET ... NX GET, EVALSHA
or EVAL) with a reply a real Redis never sends, chosen by MODE:

  bigarray    *2147483647 (hiredis would allocate 16 GB of pointers)
  nested      six arrays of 200,000 elements, each in the one before
  bigbulk     a 900,000,000-byte bulk string, then 48 MB of it
  tenbulk     a 10-digit bulk string length, then 48 MB of it
  nestedbulk  the same bulk string inside an array (hiredis's path)
  error       an error reply whose text holds a bare LF and a forged line
  longerror   an error reply of 1,010 bytes with an ESC

usage: hostile_redis.py PORT MODE
It prints "ready" once listening, and counts the hostile replies it sent in
the file named by $HOSTILE_COUNT (if set), one line each.  It sends one:
later commands (the claim sent again, the release of a lost claim) get an
error reply, so that the module's log shows what one hostile reply costs.
"""

import hashlib
import os
import socket
import socketserver
import sys

PORT = int(sys.argv[1])
MODE = sys.argv[2]
FLOOD = 48 * 1024 * 1024
sent_once = False


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def hostile(sock):
    count = os.environ.get("HOSTILE_COUNT")
    if count:
        with open(count, "a") as f:
            f.write(MODE + "\n")

    if MODE == "bigarray":
        sock.sendall(b"*2147483647\r\n:1\r\n:1\r\n")
    elif MODE == "nested":
        # within hiredis 0.14's depth of 7; 1.x has no depth limit
        sock.sendall(b"*200000\r\n" * 6)
    elif MODE == "error":
        sock.sendall(b"-ERR boom\nforged: this line is not nginx's"
                     b"\x1b[31m\r\n")
        return
    elif MODE == "longerror":
        sock.sendall(b"-ERR \x1b[31m" + b"A" * 1000 + b"\r\n")
        return
    else:
        head = {"bigbulk": b"$900000000\r\n",
                "tenbulk": b"$1000000000\r\n",
                "nestedbulk": b"*1\r\n$900000000\r\n"}[MODE]
        sock.sendall(head)
        chunk = b"x" * 65536
        sent = 0
        while sent < FLOOD:
            sock.sendall(chunk)
            sent += len(chunk)
    # hold the connection: the module is the one to close it
    sock.settimeout(30)
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        global sent_once
        sock = self.request
        buf = b""
        try:
            while True:
                cmd, buf = self.command(sock, buf)
                if cmd is None:
                    return
                name = cmd[0].upper()
                if name in (b"CLIENT", b"SELECT", b"AUTH"):
                    sock.sendall(b"+OK\r\n")
                elif name == b"PING":
                    sock.sendall(b"+PONG\r\n")
                elif name == b"INFO":
                    sock.sendall(bulk(b"# Server\r\nredis_version:7.2.4\r\n"))
                elif name == b"SCRIPT" and len(cmd) > 2:
                    sock.sendall(bulk(hashlib.sha1(cmd[2]).hexdigest()
                                      .encode()))
                elif sent_once:
                    sock.sendall(b"-ERR the fake Redis is hostile once\r\n")
                else:
                    sent_once = True
                    hostile(sock)
                    if not MODE.endswith("error"):
                        return
        except OSError:
            return

    @staticmethod
    def command(sock, buf):
        """one RESP array of bulk strings, as clients send commands"""
        def need(n):
            nonlocal buf
            while len(buf) < n:
                d = sock.recv(65536)
                if not d:
                    raise OSError("closed")
                buf += d

        def line():
            nonlocal buf
            while b"\r\n" not in buf:
                need(len(buf) + 1)
            l, buf = buf.split(b"\r\n", 1)
            return l

        try:
            head = line()
        except OSError:
            return None, buf
        n = int(head[1:])
        args = []
        for _ in range(n):
            size = int(line()[1:])
            need(size + 2)
            args.append(buf[:size])
            buf = buf[size + 2:]
        return args, buf


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


with Server(("127.0.0.1", PORT), Handler) as server:
    print("ready", flush=True)
    server.serve_forever()
