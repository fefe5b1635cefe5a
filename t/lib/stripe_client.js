// One scenario of t/047-stripe-sdk.t with Stripe's own Node.js library:
//   node stripe_client.js STRIPE_DIR PORT SCENARIO KEY
// Prints one JSON line: what the library returned or threw.
'use strict';

const [dir, port, scenario, key] = process.argv.slice(2);
const Stripe = require(dir + '/node_modules/stripe');

const stripe = Stripe('sk_test_idempotency', {
    host: '127.0.0.1', port: Number(port), protocol: 'http',
    maxNetworkRetries: 4, timeout: 20000,
});

function report(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

function create(amount) {
    return stripe.charges.create({ amount, currency: 'usd' },
                                 { idempotencyKey: key });
}

async function main() {
    try {
        const amounts = scenario === 'mismatch' ? [100, 200] : [100];
        let last;
        for (const a of amounts) {
            last = await create(a);
        }
        report({ ok: true, id: last.id });
    } catch (e) {
        report({ ok: false, class: e.constructor.name,
                 type: e.raw ? e.raw.type : null,
                 code: e.code, status: e.statusCode });
    }
}

main();
