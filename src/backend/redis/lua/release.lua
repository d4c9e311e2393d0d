-- release-and-wake-next
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim   KEYS[4] this lease's release record
-- KEYS[5] queue expiry index
-- ARGV[1] token  ARGV[2] instance id  ARGV[3] claim ttl ms  ARGV[4] channel prefix
-- ARGV[5] the wake-up message (a lock-kind tag byte + the key, built in Rust)  ARGV[6] release record ttl ms
-- Fair mode only, when this instance has another local waiter: ARGV[7] that waiter's
-- age in µs, ARGV[8] queue entry ttl ms. The instance is (re)queued at the waiter's
-- arrival time (TIME µs − age) before the head is chosen, so the claim goes to it if
-- it arrived before every other waiting instance.
--
-- Returns { released, others [, publish error] }. released = 1 if the lock was ours and
-- is deleted now, or if this lease's release record shows that an earlier attempt of
-- this release deleted it (a retry after a lost reply, whatever other instances did
-- with the key meanwhile: the record is per lease, not per key); 0 if it was not ours
-- (nothing deleted).
-- If the lock is free afterwards and nobody holds a claim, the head of the queue gets
-- a claim window and one message on its channel; a refused PUBLISH takes the claim
-- back and is reported as the third element.
--
-- The delete is the script's first write and the record is written after it: under
-- `maxmemory` with `noeviction` Redis refuses a script's first write if it may grow
-- memory (SET does, DEL does not) but never a later one, so a release frees the lock
-- even when the server is out of memory.
--
-- Fast path (ours, nobody queued): GET lock, ZCARD queue, DEL lock, SET record: 4
-- commands. While the lock is held there
-- is no claim (a claim is only ever set on a free lock, and taking the lock deletes it),
-- so the claim key is read only when the script may write it: when the lock is not
-- ours, or when someone is queued.
local lock, queue, claim, record, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, me = ARGV[1], ARGV[2]
local requeue = ARGV[7] ~= nil

-- Reads.
local current = read('lock', 'GET', lock)
local ours = current == token
local previous = released_before(ours, record)
local q = read_queue(queue, expiry, me, true, requeue, requeue)
local mine_at
if requeue then
  mine_at = now().us - tonumber(ARGV[7])
  if q.head == nil or mine_at <= tonumber(redis.call('ZSCORE', queue, q.head)) then
    q.head = me
  end
end
local claimant = false
if not ours or q.head ~= nil then
  claimant = read('claim', 'GET', claim)
end

-- Writes: the delete first (see above), then the record.
if ours then
  redis.call('DEL', lock)
  current = false
end
local released = settle_release(ours, previous, record, token, ARGV[6])
purge(queue, expiry, q)
if requeue then
  enqueue(queue, expiry, me, mine_at, tonumber(ARGV[8]))
end
local refused
if current == false and claimant == false and q.head ~= nil then
  refused = wake(q.head, claim, tonumber(ARGV[3]), ARGV[4] .. q.head, ARGV[5])
end
return { released, q.others, refused }
