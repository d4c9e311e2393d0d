-- leave: a waiting instance gives up
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim
-- ARGV[1] instance id  ARGV[2] claim ttl ms  ARGV[3] channel prefix  ARGV[4] raw key
--
-- Removes the instance's queue entry; if it held the claim, the claim passes to the
-- next live waiter. Returns the number of other live entries.
local lock, queue, claim = KEYS[1], KEYS[2], KEYS[3]
local me = ARGV[1]
redis.call('HDEL', queue, me)
if redis.call('GET', claim) == me then
  redis.call('DEL', claim)
end
return wake_next(lock, queue, claim, me, tonumber(ARGV[2]), ARGV[3], ARGV[4])
