// Webhook senders and a webhook receiver for t/068-webhooks.t, with the
// official libraries on both sides, at the versions npm_cache.js names:
// Standard Webhooks' (npm "standardwebhooks"), whose Webhook class signs
// (sign(msgId, date, payload)) and verifies (verify(payload, headers)),
// and Stripe's (npm "stripe"), whose webhooks.generateTestHeaderString()
// signs an event as Stripe does and webhooks.constructEvent() verifies it
// and parses it.  Svix signs as Standard Webhooks under svix-* headers;
// GitHub and Shopify are checked with the HMACs their documentation
// gives, by node's crypto.  Stripe's event id is in the body ("id"), the
// others' in a header.
//
//   node webhooks.js install
//     Installs the libraries, unless they are there, into a cache outside
//     the repository (t/lib/npm_cache.js says which).  Prints the
//     libraries' names and versions; exits 1 with why on stderr if it
//     cannot.
//
//   node webhooks.js origin PORT LOG
//     The receiver: listens on 127.0.0.1:PORT, prints "ready", and answers
//     POST .../SENDER (standard, svix, github, shopify, stripe: the last
//     segment of the path).  A delivery whose signature does not verify
//     gets 400
//     {"error": why}; one that does is an execution, numbered per sender
//     and event id, and gets 200 {"event", "run", "previous"} ("previous":
//     the Idempotency-Previous-Outcome header, or null).  Every delivery
//     that reaches it appends "verified|rejected SENDER ID" to LOG before
//     it answers.  The payload's "test" member steers the execution:
//     "hold_ms" delays the answer of its first execution, "fail_runs": N
//     answers 500 to the first N executions of the event.  It exits when
//     its parent does.
//
//   node webhooks.js send PORT FILE
//     The senders: FILE holds a JSON array of deliveries, all sent at
//     once to 127.0.0.1:PORT, each signed afresh as a sender signs a
//     redelivery, with a timestamp "age" seconds old (default: n for the
//     n-th), so that no two carry the same signature:
//       { "path", "sender", "id", "body", "age",
//         "bad": true      signed with another secret,
//         "noid": true     without the event id header,
//         "hook": "N"      GitHub's X-GitHub-Hook-ID (default "1"),
//         "timeout": MS    the sender gives up (closes) after MS (20000) }
//     Prints one JSON line per delivery, in their order: {status, body,
//     replayed, retry_after, ms}; status 0 if the sender gave up.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const http = require('http');
const npmCache = require('./npm_cache');


// each sender's signing secret, and the one a forger signs with
function secrets(word) {
  const standard = 'whsec_'
    + Buffer.from(`standard webhooks ${word} secret`).toString('base64');
  return { standard, svix: standard, github: `github ${word} secret`,
           shopify: `shopify ${word} secret`,
           stripe: `whsec_stripe_${word}_secret` };
}
const SECRET = secrets('test');
const FORGED = secrets('forged');
// the header that names the event: the key of each sender's recipe
// (Stripe's is the body's "id")
const ID_HEADER = { standard: 'webhook-id', svix: 'svix-id',
                    github: 'X-GitHub-Delivery',
                    shopify: 'X-Shopify-Webhook-Id' };

// a Stripe client: its webhooks sign and verify, with no API call
let stripeClient;
function stripeOf(libs) {
  stripeClient = stripeClient || new libs.stripe('sk_test_webhooks');
  return stripeClient;
}

// the event id of a Stripe event's body, or "-"
function bodyId(body) {
  try {
    return JSON.parse(body.toString('utf8')).id || '-';
  } catch (e) {
    return '-';
  }
}

const hmac = (secret, body) => crypto.createHmac('sha256', secret)
  .update(body);

// the headers SENDER puts on a delivery of BODY (a Buffer) for event ID
function sign(libs, sender, secret, id, body, when, hook) {
  if (sender === 'stripe') {
    return { 'Stripe-Signature': stripeOf(libs).webhooks
      .generateTestHeaderString({
      payload: body.toString('utf8'), secret,
      timestamp: Math.floor(when.getTime() / 1000) }) };
  }
  if (sender === 'github') {
    return { [ID_HEADER.github]: id, 'X-GitHub-Event': 'push',
             'X-GitHub-Hook-ID': hook || '1',
             'X-Hub-Signature-256': 'sha256=' + hmac(secret, body)
               .digest('hex') };
  }
  if (sender === 'shopify') {
    return { [ID_HEADER.shopify]: id, 'X-Shopify-Topic': 'orders/create',
             'X-Shopify-Hmac-Sha256': hmac(secret, body).digest('base64') };
  }
  const p = sender === 'svix' ? 'svix' : 'webhook';
  const wh = new libs.standardwebhooks.Webhook(secret);
  return { [`${p}-id`]: id,
           [`${p}-timestamp`]: String(Math.floor(when.getTime() / 1000)),
           [`${p}-signature`]: wh.sign(id, when, body) };
}

// the event id of a delivery to SENDER whose signature verifies, else
// throws why
function verify(libs, sender, headers, body) {
  const h = (name) => headers[name.toLowerCase()] || '';
  if (sender === 'stripe') {
    return stripeOf(libs).webhooks.constructEvent(
      body, h('Stripe-Signature'), SECRET.stripe).id;
  }
  const same = (a, b) => a.length === b.length
    && crypto.timingSafeEqual(Buffer.from(a), Buffer.from(b));
  if (sender === 'github') {
    const want = 'sha256=' + hmac(SECRET.github, body).digest('hex');
    if (!same(h('X-Hub-Signature-256'), want)) {
      throw new Error('X-Hub-Signature-256 does not match');
    }
    return h(ID_HEADER.github);
  }
  if (sender === 'shopify') {
    const want = hmac(SECRET.shopify, body).digest('base64');
    if (!same(h('X-Shopify-Hmac-Sha256'), want)) {
      throw new Error('X-Shopify-Hmac-Sha256 does not match');
    }
    return h(ID_HEADER.shopify);
  }
  // Svix's headers are Standard Webhooks' under another prefix
  const p = sender === 'svix' ? 'svix' : 'webhook';
  new libs.standardwebhooks.Webhook(SECRET[sender]).verify(body, {
    'webhook-id': h(`${p}-id`), 'webhook-timestamp': h(`${p}-timestamp`),
    'webhook-signature': h(`${p}-signature`) });
  return h(`${p}-id`);
}

function origin(libs, port, log) {
  const runs = new Map();
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const sender = req.url.split('/').pop();
      const answer = (status, obj, hold) => setTimeout(() => {
        res.writeHead(status, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(obj));
      }, hold || 0);
      let id;
      try {
        if (!SECRET[sender]) {
          throw new Error(`no sender "${sender}"`);
        }
        id = verify(libs, sender, req.headers, body);
      } catch (e) {
        const named = ID_HEADER[sender] || 'webhook-id';
        const said = sender === 'stripe' ? bodyId(body)
          : req.headers[named.toLowerCase()] || '-';
        fs.appendFileSync(log, `rejected ${sender} ${said}\n`);
        answer(400, { error: e.message });
        return;
      }
      const key = `${sender} ${id}`;
      const run = (runs.get(key) || 0) + 1;
      runs.set(key, run);
      fs.appendFileSync(log, `verified ${key}\n`);
      let test = {};
      try {
        test = JSON.parse(body.toString('utf8')).test || {};
      } catch (e) {
        // not JSON: nothing to steer
      }
      answer(run <= (test.fail_runs || 0) ? 500 : 200,
             { event: id, run,
               previous: req.headers['idempotency-previous-outcome'] || null },
             run === 1 ? test.hold_ms : 0);
    });
  });
  server.listen(Number(port), '127.0.0.1', () => {
    process.stdout.write('ready\n');
  });
  // the test is gone (killed): so is its receiver
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) {
      process.exit(0);
    }
  }, 500).unref();
}

function deliver(libs, port, d, n) {
  const body = Buffer.from(d.body, 'utf8');
  const when = new Date(Date.now() - (d.age === undefined ? n : d.age) * 1000);
  const secret = (d.bad ? FORGED : SECRET)[d.sender];
  const headers = sign(libs, d.sender, secret, d.id, body, when, d.hook);
  if (d.noid) {
    delete headers[ID_HEADER[d.sender]];
  }
  headers['Content-Type'] = 'application/json';
  headers['Content-Length'] = body.length;
  const t0 = Date.now();
  return new Promise((resolve) => {
    const done = (status, res, text) => resolve({
      status, body: text,
      replayed: res ? res.headers['idempotent-replayed'] || null : null,
      retry_after: res ? res.headers['retry-after'] || null : null,
      ms: Date.now() - t0 });
    const req = http.request({ host: '127.0.0.1', port: Number(port),
                               method: 'POST', path: d.path, headers,
                               agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => done(res.statusCode, res,
                               Buffer.concat(chunks).toString('utf8')));
      res.on('error', () => done(0, null, ''));
    });
    req.setTimeout(d.timeout || 20000, () => req.destroy());
    req.on('error', () => done(0, null, ''));
    req.end(body);
  });
}

async function send(libs, port, file) {
  const all = JSON.parse(fs.readFileSync(file, 'utf8'));
  const out = await Promise.all(all.map((d, n) => deliver(libs, port, d, n)));
  for (const o of out) {
    process.stdout.write(JSON.stringify(o) + '\n');
  }
}

async function run(libs, args) {
  if (args[0] === 'origin') {
    origin(libs, args[1], args[2]);
  } else if (args[0] === 'send') {
    await send(libs, args[1], args[2]);
  } else {
    throw new Error('usage: install | origin PORT LOG | send PORT FILE');
  }
}

npmCache.main(['standardwebhooks', 'stripe'], 'webhooks.js',
              process.argv.slice(2), run);
