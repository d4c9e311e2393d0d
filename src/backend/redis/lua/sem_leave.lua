-- semaphore leave: this instance no longer waits
--
-- KEYS[1] permit set   KEYS[2] count (N)   KEYS[3] waiting set
-- KEYS[4] waiting set expiry index
-- ARGV[1] instance id   ARGV[2] channel prefix   ARGV[3] the wake-up message (a lock-kind tag byte + the key, built in Rust)
--
-- Removes the instance's waiting entry. A wake-up it may have been sent (a free
-- permit it will not take) is passed on: with f permits free, up to f other waiting
-- instances are told, oldest first. Returns { woken [, publish error] }.
local permits, count, queue, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me = ARGV[1]

-- Reads.
local stored = read('permit count', 'GET', count)
local p = read_permits(permits)
local q = read_queue(queue, expiry, me, false, false, false)

-- Writes.
purge_permits(permits, p)
purge(queue, expiry, q)
dequeue(queue, expiry, me)
local free = 0
if tonumber(stored) then
  free = tonumber(stored) - p.live
end
local woken, refused = notify(heads(queue, q, free, me), ARGV[2], ARGV[3])
if p.live == 0 and q.others == 0 and stored then
  redis.call('DEL', count)
end
return { woken, refused }
