// One round with Stripe's own Node library: each key is one
// stripe.charges.create() with that idempotencyKey, its retries left to
// the library (maxNetworkRetries).  Even keys go to the first edge, odd
// keys to the second.  Prints one JSON line per key: what the library
// handed to the application (a result, or the error it threw).
//
//   NODE_PATH=<cache>/node_modules node stripe-round.js PORT_A PORT_B KEY...
'use strict';
const Stripe = require('stripe');

const [portA, portB, ...keys] = process.argv.slice(2);
const client = (port) => new Stripe('sk_test_faults', {
  host: '127.0.0.1', port: Number(port), protocol: 'http',
  maxNetworkRetries: 4, timeout: 5000, telemetry: false,
});
const edges = [client(portA), client(portB)];

async function one(key, i) {
  const t0 = Date.now() / 1000;
  const out = { key, t0 };
  try {
    const res = await edges[i % 2].charges.create(
      { amount: 1000 + i, currency: 'usd' }, { idempotencyKey: key });
    const last = res.lastResponse || {};
    out.resolved = true;
    out.status = last.statusCode;
    out.headers = last.headers || {};
    out.body = JSON.stringify(res);
  } catch (e) {
    out.resolved = false;
    out.error = e.type || e.name;
    out.status = e.statusCode || 0;
    out.headers = e.headers || {};
    out.charge = e.raw && e.raw.charge;
    out.code = e.code;
    out.message = e.message;
  }
  out.t1 = Date.now() / 1000;
  return out;
}

Promise.all(keys.map(one)).then((all) => {
  for (const o of all) console.log(JSON.stringify(o));
});
