-- release-and-wake-next
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim
-- ARGV[1] token  ARGV[2] instance id  ARGV[3] claim ttl ms  ARGV[4] channel prefix
-- ARGV[5] raw key (the wake-up message)
--
-- Returns { released, others }: released = 1 if the lock was ours and is deleted,
-- 0 if it was not ours (nothing deleted). If the lock is free afterwards, the head
-- of the queue gets a claim window and one message on its channel.
local lock, queue, claim = KEYS[1], KEYS[2], KEYS[3]
local token, me, claim_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

local released = 0
if redis.call('GET', lock) == token then
  redis.call('DEL', lock)
  released = 1
end
local others = wake_next(lock, queue, claim, me, claim_ttl, ARGV[4], ARGV[5])
return { released, others }
