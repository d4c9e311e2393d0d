-- extend: compare-and-PEXPIRE
--
-- KEYS[1] lock   KEYS[2] fence   KEYS[3] queue   KEYS[4] queue expiry index
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] fence ttl ms  ARGV[4] instance id
--
-- Returns { 1, others } when extended, { 0, 0 } when the token does not own the lock.
local lock, fence, queue, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- Reads.
if read('lock', 'GET', lock) ~= ARGV[1] then
  return { 0, 0 }
end
local q = read_queue(queue, expiry, ARGV[4], false, false, false)

-- Writes.
redis.call('PEXPIRE', lock, tonumber(ARGV[2]))
redis.call('PEXPIRE', fence, tonumber(ARGV[3]))
purge(queue, expiry, q)
return { 1, q.others }
