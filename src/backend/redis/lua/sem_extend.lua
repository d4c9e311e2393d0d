-- semaphore extend: compare-and-re-arm one permit
--
-- KEYS[1] permit set   KEYS[2] count (N)
-- ARGV[1] token   ARGV[2] permit ttl ms
--
-- Returns { 1 } when re-armed, { 0 } when the token is no live permit (expired or
-- removed): the permit is lost.
local permits, count = KEYS[1], KEYS[2]

-- Reads.
local score = read('permit set', 'ZSCORE', permits, ARGV[1])
if not score or tonumber(score) <= now().ms then
  return { 0 }
end
read('permit count', 'GET', count)

-- Writes.
local ttl = tonumber(ARGV[2])
redis.call('ZADD', permits, 'XX', string.format('%.0f', now().ms + ttl), ARGV[1])
keep(permits, ttl)
keep(count, ttl)
return { 1 }
