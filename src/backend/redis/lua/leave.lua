-- leave: a waiting instance gives up
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim   KEYS[4] queue expiry index
-- ARGV[1] instance id  ARGV[2] claim ttl ms  ARGV[3] channel prefix  ARGV[4] the wake-up message
-- ARGV[5] "1": only if this instance holds the key's claim (an unwanted wake-up)
-- ARGV[6] (optional) a token of this instance that a release granted the lock to
-- and that nobody here took (an unwanted grant, see release.lua): if the lock is
-- still that token's and the grant's mark is still there (no ask with the token
-- took the lock since), it is deleted first, without a release record (the
-- token's owner never took the grant, and may still ask with it); if not, nothing
-- changes and { 0, 0 } is returned.
--
-- Removes the instance's queue entry; if it held the claim, the claim passes to the
-- next live waiter. Returns { 1, others [, publish error] } (others: the live entries
-- left; a refused PUBLISH takes the passed claim back and is reported), or { 0, 0 }
-- when ARGV[5] is "1" and the claim is not ours: then nothing changes (a newer waiter
-- of this instance may have consumed the claim, or queued again, meanwhile).
local lock, queue, claim, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me = ARGV[1]

-- Reads.
local claimant = read('claim', 'GET', claim)
if ARGV[5] == '1' and claimant ~= me then
  return { 0, 0 }
end
local given_back = false
local mark = lock .. ':g:' .. me
if ARGV[6] ~= nil then
  given_back = read('lock', 'GET', lock) == ARGV[6]
    and redis.call('GET', mark) == 'granted ' .. ARGV[6]
  if not given_back then
    -- Taken, or gone: nothing changes (a newer waiter of this instance may have
    -- queued meanwhile).
    return { 0, 0 }
  end
end
local lock_free = given_back or redis.call('EXISTS', lock) == 0
local q = read_queue(queue, expiry, me, true, true, false)

-- Writes.
if given_back then
  redis.call('DEL', lock, mark)
end
if q.mine then
  dequeue(queue, expiry, me)
end
purge(queue, expiry, q)
if claimant == me then
  redis.call('DEL', claim)
  claimant = false
end
local refused
if lock_free and claimant == false and q.head ~= nil then
  refused = wake(q.head, claim, tonumber(ARGV[2]), ARGV[3] .. q.head, ARGV[4])
end
return { 1, q.others, refused }
