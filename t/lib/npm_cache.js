// The npm libraries the tests drive (t/lib/stripe_client.js,
// t/lib/webhooks.js), installed at one exact version into a cache outside
// the repository: the first of $STRIPE_NODE_DIR (named for the first
// library it held), /var/cache/ngx-idempotency-npm and
// ~/.cache/ngx-idempotency-npm that has the library, else the first that
// can be written.  util/trixie.sh installs them into the Debian 13 root,
// whose runs have no network: `node npm_cache.js list` names them.
'use strict';
const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

// every library a driver may use, at the one version the tests know
const VERSIONS = {
  standardwebhooks: '1.3.0',
  stripe: '23.1.0',
};

const caches = [process.env.STRIPE_NODE_DIR, '/var/cache/ngx-idempotency-npm',
                path.join(os.homedir(), '.cache', 'ngx-idempotency-npm')]
  .filter(Boolean);

function installedIn(dir, name, version) {
  try {
    const pkg = path.join(dir, 'node_modules', name, 'package.json');
    return JSON.parse(fs.readFileSync(pkg, 'utf8')).version === version;
  } catch (e) {
    return false;
  }
}

function writable(dir) {
  try {
    fs.mkdirSync(dir, { recursive: true });
    fs.accessSync(dir, fs.constants.W_OK);
    return true;
  } catch (e) {
    return false;
  }
}

// name@version into the cache, unless a cache has it already
function install(name, version) {
  if (caches.some((dir) => installedIn(dir, name, version))) {
    return;
  }
  const dir = caches.find(writable);
  if (!dir) {
    throw new Error('no writable cache directory for npm: '
                    + caches.join(', '));
  }
  const out = childProcess.spawnSync('npm', [
    'install', '--prefix', dir, '--no-audit', '--no-fund', '--silent',
    `${name}@${version}`], { encoding: 'utf8', timeout: 300000 });
  if (out.error || out.status !== 0) {
    throw new Error(`npm install ${name}@${version} failed: `
                    + (out.error ? out.error.message
                                 : out.stderr.trim().slice(-300)));
  }
}

// the installed library, as require() gives it
function load(name, version) {
  const dir = caches.find((d) => installedIn(d, name, version));
  if (!dir) {
    throw new Error(`${name}@${version} is not installed: run install first`);
  }
  return require(path.join(dir, 'node_modules', name));
}

// a driver's command line: "install" installs the libraries it names
// and prints name@version of each; anything else is run(libraries, args),
// libraries by name as require() gives them; a failure is one line on
// stderr (SCRIPT: why) and exit code 1
async function main(names, script, args, run) {
  try {
    if (args[0] === 'install') {
      for (const name of names) {
        install(name, VERSIONS[name]);
        process.stdout.write(`${name}@${VERSIONS[name]}\n`);
      }
    } else {
      const libs = {};
      for (const name of names) {
        libs[name] = load(name, VERSIONS[name]);
      }
      await run(libs, args);
    }
  } catch (e) {
    process.stderr.write(`${script}: ${e.message}\n`);
    process.exitCode = 1;
  }
}

// node npm_cache.js list: name@version of every library, a line each
if (require.main === module && process.argv[2] === 'list') {
  for (const name of Object.keys(VERSIONS)) {
    process.stdout.write(`${name}@${VERSIONS[name]}\n`);
  }
}

module.exports = { install, load, main };
