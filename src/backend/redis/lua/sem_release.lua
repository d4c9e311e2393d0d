-- semaphore release-and-wake
--
-- KEYS[1] permit set   KEYS[2] count (N)   KEYS[3] waiting set
-- KEYS[4] waiting set expiry index   KEYS[5] this permit's release record
-- ARGV[1] token   ARGV[2] channel prefix   ARGV[3] the wake-up message (a lock-kind tag byte + the key, built in Rust)
-- ARGV[4] release record ttl ms
--
-- Returns { released, woken [, publish error] }: released = 1 if the token was a live
-- permit and is removed now, or if its release record shows that an earlier attempt
-- of this release removed it (a retry after a lost reply); 0 if it was not (expired,
-- or removed: nothing of anyone else's is touched). As in release.lua, the removal is
-- the first write and the record is written after it, so a release works under
-- `maxmemory` / `noeviction`. Then, with f permits free (expired ones purged too), the raw
-- key is published on the channels of up to f waiting instances, oldest first: one
-- wake-up per free permit, never a broadcast. A refused PUBLISH is reported as the
-- third element. With no permit and no waiting instance left, the count key goes.
local permits, count, queue, expiry, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token = ARGV[1]

-- Reads.
local stored = read('permit count', 'GET', count)
local p = read_permits(permits)
local score = false
if p.size > 0 then
  score = redis.call('ZSCORE', permits, token)
end
local q = read_queue(queue, expiry, '', false, false, false)
local held = score and tonumber(score) > now().ms
local previous = released_before(held, record)

-- Writes: the removals first, then the record.
purge_permits(permits, p)
local live = p.live
if score then
  if held then
    live = live - 1
  end
  redis.call('ZREM', permits, token)
end
local released = settle_release(held, previous, record, token, ARGV[4])
purge(queue, expiry, q)
local free
if tonumber(stored) then
  free = tonumber(stored) - live
else
  free = (held and 1 or 0) + #p.expired
end
local woken, refused = notify(heads(queue, q, free, nil), ARGV[2], ARGV[3])
if live == 0 and q.others == 0 and stored then
  redis.call('DEL', count)
end
return { released, woken, refused }
