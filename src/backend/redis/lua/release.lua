-- release-and-wake-next
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim   KEYS[4] release tombstone
-- ARGV[1] token  ARGV[2] instance id  ARGV[3] claim ttl ms  ARGV[4] channel prefix
-- ARGV[5] raw key (the wake-up message)  ARGV[6] tombstone ttl ms
--
-- Returns { released, others [, publish error] }. released = 1 if the lock was ours and
-- is deleted now, or if the tombstone shows that an earlier release with this token
-- deleted it (a retry after a lost reply); 0 if it was not ours (nothing deleted).
-- If the lock is free afterwards and nobody holds a claim, the head of the queue gets
-- a claim window and one message on its channel; a refused PUBLISH takes the claim
-- back and is reported as the third element.
local lock, queue, claim, tombstone = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, me = ARGV[1], ARGV[2]

-- Reads.
local current = read('lock', 'GET', lock)
local previous = read('tombstone', 'GET', tombstone)
local q = read_queue(queue, me, false)
local claimant = read('claim', 'GET', claim)

-- Writes.
local released = 0
if current == token then
  redis.call('DEL', lock)
  redis.call('SET', tombstone, token, 'PX', tonumber(ARGV[6]))
  released, current = 1, false
elseif previous == token then
  released = 1
end
purge(queue, q)
local refused
if current == false and claimant == false and q.head ~= nil then
  refused = wake(q.head, claim, tonumber(ARGV[3]), ARGV[4] .. q.head, ARGV[5])
end
return { released, q.others, refused }
