// A Redisson RLock peer for tests/dialects.rs, on node-redisson (Redisson's layout in
// Node.js) over ioredis. Usage: node redisson.js PORT NAME [WATCHDOG_MS]
// Reads commands on stdin, one a line, and answers on stdout:
//   try            -> TRY true|false       (tryLock without waiting; Redisson's watchdog lease)
//   lock [LEASE]   -> LOCKED               (waits; with LEASE ms a fixed lease, no watchdog)
//   wait MS        -> GOT | TIMEOUT        (tryLock waiting at most MS)
//   unlock         -> UNLOCKED | ERROR ...
//   incr FILE N    -> DONE                 (N times: lock, read the number in FILE, write it + 1, unlock)
//   quit
const { Redisson } = require('node-redisson');
const fs = require('fs');
const readline = require('readline');

const [port, name, watchdog] = process.argv.slice(2);
const config = { redis: { options: { host: '127.0.0.1', port: Number(port) } } };
if (watchdog) {
  config.lockWatchdogTimeout = BigInt(watchdog);
}
const redisson = new Redisson(config);
const lock = redisson.getLock(name);
const say = (line) => process.stdout.write(line + '\n');

async function handle(words) {
  switch (words[0]) {
    case 'try':
      say('TRY ' + (await lock.tryLock(0)));
      break;
    case 'lock':
      await (words[1] ? lock.lock(Number(words[1])) : lock.lock());
      say('LOCKED');
      break;
    case 'wait':
      say((await lock.tryLock(Number(words[1]))) ? 'GOT' : 'TIMEOUT');
      break;
    case 'unlock':
      await lock.unlock();
      say('UNLOCKED');
      break;
    case 'incr':
      for (let i = 0; i < Number(words[2]); i++) {
        await lock.lock();
        const n = Number(fs.readFileSync(words[1], 'utf8').trim() || '0');
        fs.writeFileSync(words[1], String(n + 1));
        await lock.unlock();
      }
      say('DONE');
      break;
    case 'quit':
      await redisson.quit();
      process.exit(0);
    default:
      say('ERROR unknown command ' + words[0]);
  }
}

// One command at a time, in order.
let queue = Promise.resolve();
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const words = line.trim().split(/\s+/);
  queue = queue.then(() => handle(words)).catch((e) => say('ERROR ' + e.message));
});
say('READY');
