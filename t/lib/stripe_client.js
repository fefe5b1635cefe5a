// Stripe's own Node.js library (npm "stripe", at the version npm_cache.js
// names) pointed at nginx as its API host, for t/047-stripe-sdk.t and the
// fault campaign's round (faults/stripe_round.py).
//
//   node stripe_client.js install
//     Installs the library, unless it is there, into a cache outside the
//     repository (t/lib/npm_cache.js says which).  Prints the library's
//     name and version; exits 1 with why on stderr if it cannot.
//
//   node stripe_client.js [--timeout MS] PORT[,PORT]... KEY:AMOUNT[,AMOUNT]...
//     For each KEY at once, one stripe.charges.create() per AMOUNT in
//     turn, with that idempotencyKey, its retries left to the library
//     (maxNetworkRetries); the n-th KEY goes to the n-th PORT (round
//     robin); the library gives up on a request after MS (20000).  Prints
//     one JSON line per KEY, in their order: what the library handed the
//     application for the last call made, a result or the error it threw.
'use strict';
const npmCache = require('./npm_cache');


async function one(edges, key, amounts, i) {
  const out = { key, t0: Date.now() / 1000 };
  try {
    let res;
    for (const amount of amounts) {
      res = await edges[i % edges.length].charges.create(
        { amount, currency: 'usd' }, { idempotencyKey: key });
    }
    const last = res.lastResponse || {};
    out.resolved = true;
    out.id = res.id;
    out.status = last.statusCode;
    out.headers = last.headers || {};
    out.body = JSON.stringify(res);
  } catch (e) {
    out.resolved = false;
    out.error = e.type || e.name;
    out.type = e.raw ? e.raw.type : null;
    out.code = e.code;
    out.message = e.message;
    out.status = e.statusCode || 0;
    out.headers = e.headers || {};
    out.charge = e.raw && e.raw.charge;
  }
  out.t1 = Date.now() / 1000;
  return out;
}

async function run(libs, args) {
  const Stripe = libs.stripe;
  let timeout = 20000;
  if (args[0] === '--timeout') {
    timeout = Number(args[1]);
    args = args.slice(2);
  }
  const edges = args[0].split(',').map((port) => new Stripe('sk_test_idem', {
    host: '127.0.0.1', port: Number(port), protocol: 'http',
    maxNetworkRetries: 4, timeout, telemetry: false,
  }));
  const calls = args.slice(1).map((arg) => {
    const at = arg.lastIndexOf(':');
    return [arg.slice(0, at), arg.slice(at + 1).split(',').map(Number)];
  });
  const all = await Promise.all(
    calls.map(([key, amounts], i) => one(edges, key, amounts, i)));
  for (const o of all) {
    process.stdout.write(JSON.stringify(o) + '\n');
  }
}

npmCache.main(['stripe'], 'stripe_client.js', process.argv.slice(2), run);
