-- fence write-back (Redlock): raise the key's fence counter to the token minted from
-- the granting majority, only where this token still owns the lock.
--
-- KEYS[1] lock   KEYS[2] fence
-- ARGV[1] token  ARGV[2] epoch t (decimal)  ARGV[3] fence ttl ms
--
-- Returns 1 if the token owns the lock here (the fence is now >= t), 0 if it does not
-- (nothing written). A value of another type at either name is a WRONGTYPE error
-- raised before any write.
local lock, fence = KEYS[1], KEYS[2]
local current = redis.call('GET', lock)
local last = tonumber(redis.call('GET', fence) or '0') or 0
if current ~= ARGV[1] then
  return 0
end
local t = tonumber(ARGV[2])
if t > last then
  redis.call('SET', fence, ARGV[2], 'PX', tonumber(ARGV[3]))
elseif redis.call('PTTL', fence) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', fence, tonumber(ARGV[3]))
end
return 1
