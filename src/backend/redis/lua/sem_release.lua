-- semaphore release-and-wake
--
-- KEYS[1] permit set   KEYS[2] count (N)   KEYS[3] waiting set
-- KEYS[4] waiting set expiry index
-- ARGV[1] token   ARGV[2] channel prefix   ARGV[3] raw key (the wake-up message)
--
-- Returns { released, woken [, publish error] }: released = 1 if the token was a live
-- permit and is removed now, 0 if it was not (expired, or removed: nothing of anyone
-- else's is touched). Then, with f permits free (expired ones purged too), the raw
-- key is published on the channels of up to f waiting instances, oldest first: one
-- wake-up per free permit, never a broadcast. A refused PUBLISH is reported as the
-- third element. With no permit and no waiting instance left, the count key goes.
local permits, count, queue, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token = ARGV[1]

-- Reads.
local stored = read('permit count', 'GET', count)
local p = read_permits(permits)
local score = false
if p.size > 0 then
  score = redis.call('ZSCORE', permits, token)
end
local q = read_queue(queue, expiry, '', false, false, false)

-- Writes.
purge_permits(permits, p)
local released, live = 0, p.live
if score then
  if tonumber(score) > now().ms then
    released, live = 1, live - 1
  end
  redis.call('ZREM', permits, token)
end
purge(queue, expiry, q)
local free
if tonumber(stored) then
  free = tonumber(stored) - live
else
  free = released + #p.expired
end
local woken, refused = notify(heads(queue, q, free, nil), ARGV[2], ARGV[3])
if live == 0 and q.others == 0 and stored then
  redis.call('DEL', count)
end
return { released, woken, refused }
