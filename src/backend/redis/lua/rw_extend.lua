-- read-write lock: re-arm a read or write lease
--
-- KEYS[1] read leases   KEYS[2] write lease   KEYS[3] waiting writers   KEYS[4] write fence
-- ARGV[1] "r" (read) or "w" (write)  ARGV[2] token  ARGV[3] lease ttl ms
-- ARGV[4] fence ttl ms
--
-- Returns { 1, writers } when re-armed (`writers`: the live waiting writers, other
-- than this token), { 0, 0 } when the token holds no live lease of that kind.
local readers, writer, writers, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local kind, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

-- Reads.
local t = now()
local ms = string.format('%.0f', t.ms)
if kind == 'w' then
  if read('write lease', 'GET', writer) ~= token then
    return { 0, 0 }
  end
else
  local lease = read('read leases', 'ZSCORE', readers, token)
  if not lease or tonumber(lease) <= t.ms then
    return { 0, 0 }
  end
end
local live_writers = read('waiting writers', 'ZCOUNT', writers, '(' .. ms, '+inf')

-- Writes.
if kind == 'w' then
  redis.call('PEXPIRE', writer, ttl)
else
  redis.call('ZADD', readers, 'XX', string.format('%.0f', t.ms + ttl), token)
  if redis.call('PTTL', readers) < ttl then
    redis.call('PEXPIRE', readers, ttl)
  end
end
redis.call('PEXPIRE', fence, tonumber(ARGV[4]))
return { 1, live_writers }
