"""A python-redis-lock peer for tests/dialects.rs. Usage: python pyrl.py PORT NAME [EXPIRE_S]

Reads commands on stdin, one a line, and answers on stdout:
  try            -> TRY True|False   (acquire(blocking=False))
  lock           -> LOCKED           (acquire(): waits in BLPOP on lock-signal:NAME)
  wait S         -> GOT | TIMEOUT    (acquire(timeout=S))
  unlock         -> UNLOCKED | ERROR ...
  incr FILE N    -> DONE             (N times: lock, read the number in FILE, write it + 1, unlock)
  quit
With EXPIRE_S the lock expires after that many seconds, renewed by python-redis-lock's own
auto_renewal thread; without it the lock never expires (python-redis-lock's default).
"""
import sys

import redis
import redis_lock

port, name = int(sys.argv[1]), sys.argv[2]
expire = int(sys.argv[3]) if len(sys.argv) > 3 else None
conn = redis.StrictRedis(host='127.0.0.1', port=port)
lock = redis_lock.Lock(conn, name, expire=expire, auto_renewal=expire is not None)


def say(line):
    sys.stdout.write(line + '\n')
    sys.stdout.flush()


say('READY')
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    try:
        if words[0] == 'try':
            say('TRY %s' % lock.acquire(blocking=False))
        elif words[0] == 'lock':
            lock.acquire()
            say('LOCKED')
        elif words[0] == 'wait':
            say('GOT' if lock.acquire(timeout=int(words[1])) else 'TIMEOUT')
        elif words[0] == 'unlock':
            lock.release()
            say('UNLOCKED')
        elif words[0] == 'incr':
            for _ in range(int(words[2])):
                # A fresh Lock per round: a Lock object is acquired once at a time.
                each = redis_lock.Lock(conn, name, expire=expire, auto_renewal=expire is not None)
                each.acquire()
                with open(words[1]) as f:
                    n = int(f.read().strip() or '0')
                with open(words[1], 'w') as f:
                    f.write(str(n + 1))
                each.release()
            say('DONE')
        elif words[0] == 'quit':
            break
        else:
            say('ERROR unknown command ' + words[0])
    except Exception as e:  # report to the test, keep serving
        say('ERROR %r' % e)
