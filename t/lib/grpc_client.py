#!/usr/bin/python3
"""One unary gRPC call with raw bytes, for t/014-grpc.t.

  grpc_client.py TARGET METHOD KEY PAYLOAD [CA_CERT NAME]

TARGET host:port; METHOD e.g. /idem.Pay/Charge; KEY the Idempotency-Key
("-" for none); with CA_CERT, TLS trusting that certificate for NAME.
Prints one JSON object: code, details, payload (of an OK call), initial and
trailing metadata as [name, value] pairs.
"""

import json
import sys

import grpc

target, method, key, payload = sys.argv[1:5]

if len(sys.argv) > 6:
    with open(sys.argv[5], 'rb') as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    channel = grpc.secure_channel(
        target, creds,
        options=(('grpc.ssl_target_name_override', sys.argv[6]),))
else:
    channel = grpc.insecure_channel(target)

call = channel.unary_unary(method)
metadata = () if key == '-' else (('idempotency-key', key),)
out = {}

try:
    resp, c = call.with_call(payload.encode(), metadata=metadata, timeout=10)
    out['payload'] = resp.decode('latin-1')
except grpc.RpcError as e:
    c = e
    out['payload'] = None

out['code'] = c.code().name
out['details'] = c.details()
out['initial'] = [list(m) for m in (c.initial_metadata() or ())]
out['trailing'] = [list(m) for m in (c.trailing_metadata() or ())]

print(json.dumps(out, sort_keys=True))
channel.close()
