-- release-and-wake-next
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim   KEYS[4] release tombstone
-- KEYS[5] queue expiry index
-- ARGV[1] token  ARGV[2] instance id  ARGV[3] claim ttl ms  ARGV[4] channel prefix
-- ARGV[5] raw key (the wake-up message)  ARGV[6] tombstone ttl ms
-- Fair mode only, when this instance has another local waiter: ARGV[7] that waiter's
-- age in µs, ARGV[8] queue entry ttl ms. The instance is (re)queued at the waiter's
-- arrival time (TIME µs − age) before the head is chosen, so the claim goes to it if
-- it arrived before every other waiting instance.
--
-- Returns { released, others [, publish error] }. released = 1 if the lock was ours and
-- is deleted now, or if the tombstone shows that an earlier release with this token
-- deleted it (a retry after a lost reply); 0 if it was not ours (nothing deleted).
-- If the lock is free afterwards and nobody holds a claim, the head of the queue gets
-- a claim window and one message on its channel; a refused PUBLISH takes the claim
-- back and is reported as the third element.
--
-- Fast path (ours, nobody queued): GET lock, ZCARD queue, SET tombstone … GET (type-checks
-- the tombstone key as it writes it), DEL lock: 4 commands. While the lock is held there
-- is no claim (a claim is only ever set on a free lock, and taking the lock deletes it),
-- so the claim key is read only when the script may write it: when the lock is not
-- ours, or when someone is queued.
local lock, queue, claim, tombstone, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, me = ARGV[1], ARGV[2]
local requeue = ARGV[7] ~= nil

-- Reads.
local current = read('lock', 'GET', lock)
local ours = current == token
local previous = false
if not ours then
  previous = read('tombstone', 'GET', tombstone)
end
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

-- Writes (the first, SET … GET of the tombstone, fails on a value of another type
-- before anything is written).
local released = 0
if ours then
  read('tombstone', 'SET', tombstone, token, 'PX', tonumber(ARGV[6]), 'GET')
  redis.call('DEL', lock)
  released, current = 1, false
elseif previous == token then
  released = 1
end
purge(queue, expiry, q)
if requeue then
  enqueue(queue, expiry, me, mine_at, tonumber(ARGV[8]))
end
local refused
if current == false and claimant == false and q.head ~= nil then
  refused = wake(q.head, claim, tonumber(ARGV[3]), ARGV[4] .. q.head, ARGV[5])
end
return { released, q.others, refused }
