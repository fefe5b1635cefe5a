#!/usr/bin/python3
"""gRPC backend for t/014-grpc.t, without protoc: raw bytes in and out.

  grpc_backend.py PORT COUNTER_FILE

Every call appends a line to COUNTER_FILE (the test counts executions).
Methods of the service idem.Pay:
  Charge  OK: b"charged <n>: " + request; trailing metadata x-trailer
  Fail    a response message, then status ABORTED with a message and
          x-trailer: the status travels in the trailers after the body
  Abort   context.abort(ABORTED): a trailers-only response (no body;
          grpc-status comes in the response headers)
<n> is the execution number, so a second execution is visible in replies.
"""

import sys
import threading
from concurrent import futures

import grpc
import time

port, counter = sys.argv[1], sys.argv[2]
lock = threading.Lock()


def execution(method, request):
    with lock:
        with open(counter, 'a+') as f:
            f.seek(0)
            n = len(f.readlines()) + 1
            f.write('%s %d %s\n' % (method, n, request.hex()))
    return n


def charge(request, context):
    n = execution('Charge', request)
    context.set_trailing_metadata((('x-trailer', 'charge-%d' % n),))
    return b'charged %d: ' % n + request


def fail(request, context):
    n = execution('Fail', request)
    context.set_trailing_metadata((('x-trailer', 'fail-%d' % n),))
    context.set_code(grpc.StatusCode.ABORTED)
    context.set_details('insufficient funds (%d)' % n)
    return b'declined %d: ' % n + request


def abort(request, context):
    n = execution('Abort', request)
    context.abort(grpc.StatusCode.ABORTED, 'aborted (%d)' % n)


def slow(request, context):
    # commits, then answers after grpc_read_timeout (t/014: unknown outcome)
    n = execution('Slow', request)
    time.sleep(1.5)
    return b'charged late %d: ' % n + request


def handler(fn):
    # identity (de)serializers: the messages are the bytes themselves
    return grpc.unary_unary_rpc_method_handler(fn)


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    'idem.Pay', {'Charge': handler(charge), 'Fail': handler(fail),
                 'Abort': handler(abort), 'Slow': handler(slow)}),))

if server.add_insecure_port('127.0.0.1:%s' % port) == 0:
    sys.exit('cannot listen on port %s' % port)

server.start()
print('ready', flush=True)
server.wait_for_termination()
