-- leave: a waiting instance gives up
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim
-- ARGV[1] instance id  ARGV[2] claim ttl ms  ARGV[3] channel prefix  ARGV[4] raw key
-- ARGV[5] "1": only if this instance holds the key's claim (an unwanted wake-up)
--
-- Removes the instance's queue entry; if it held the claim, the claim passes to the
-- next live waiter. Returns the number of other live entries, or -1 when ARGV[5] is
-- "1" and the claim is not ours (then nothing changes: a newer waiter of this
-- instance may have consumed the claim, or queued again, meanwhile).
local lock, queue, claim = KEYS[1], KEYS[2], KEYS[3]
local me = ARGV[1]
if ARGV[5] == '1' and redis.call('GET', claim) ~= me then
  return -1
end
redis.call('HDEL', queue, me)
if redis.call('GET', claim) == me then
  redis.call('DEL', claim)
end
return wake_next(lock, queue, claim, me, tonumber(ARGV[2]), ARGV[3], ARGV[4])
