-- fenced write: apply one small write to a resource only if the offered fencing
-- token is not older than the last one the resource accepted (equal tokens are the
-- same critical section, which may write several times; tokens are unique per
-- critical section).
--
-- KEYS[1] the resource   KEYS[2] its fence (same cluster slot; see fence/redis.rs)
-- ARGV[1] epoch   ARGV[2] seq (decimal u64, no leading zeros)
-- ARGV[3] the operation:
--   'set'     ARGV[4] value                 SET resource value
--   'setpx'   ARGV[4] value  ARGV[5] ms     SET resource value PX ms
--   'incrby'  ARGV[4] delta                 INCRBY resource delta (replies the new value)
--   'hset'    ARGV[4..] field value ...     HSET resource field value ...
--   'del'                                   DEL resource
--   'advance'                               nothing but the fence
--
-- Returns:
--   { 1, result }              applied (result: the value INCRBY made, as a
--                              string, else '0'); the fence now holds "epoch:seq"
--   { 0, last_epoch, last_seq } stale: the offered token is older than the last
--                              accepted one; nothing changed
--   { -1, role }               the resource or the fence holds a value of another
--                              type (role names which); nothing changed
--   { -2, detail }             the operation failed (INCRBY on a non-integer, …);
--                              nothing changed
--
-- Reads first, then the resource's write, then the fence's: Redis does not roll a
-- script back, so every check that can fail comes before the first write; the
-- resource's command is the only one that can still fail (and then changes
-- nothing); under maxmemory with noeviction Redis refuses a script at its first
-- write, never at a later one, so an applied write always records its token.
-- Tokens are compared as decimal strings (length first), exact for every u64.
local resource, fence = KEYS[1], KEYS[2]
local epoch, seq, op = ARGV[1], ARGV[2], ARGV[3]

local function less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

local last = redis.pcall('GET', fence)
if type(last) == 'table' and last.err then
  return { -1, 'fence' }
end
if last then
  local le, ls = string.match(last, '^(%d+):(%d+)$')
  if le == nil then
    return { -1, 'fence' }
  end
  local older = less(epoch, le) or (le == epoch and less(seq, ls))
  if older then
    return { 0, le, ls }
  end
end

local kind = redis.call('TYPE', resource)['ok']
if op == 'incrby' and kind ~= 'none' and kind ~= 'string' then
  return { -1, 'resource' }
end
if op == 'hset' and kind ~= 'none' and kind ~= 'hash' then
  return { -1, 'resource' }
end

local reply
if op == 'set' then
  reply = redis.pcall('SET', resource, ARGV[4])
elseif op == 'setpx' then
  reply = redis.pcall('SET', resource, ARGV[4], 'PX', ARGV[5])
elseif op == 'incrby' then
  reply = redis.pcall('INCRBY', resource, ARGV[4])
elseif op == 'hset' then
  reply = redis.pcall('HSET', resource, unpack(ARGV, 4))
elseif op == 'del' then
  reply = redis.pcall('DEL', resource)
elseif op == 'advance' then
  reply = 0
else
  return { -2, 'unknown operation ' .. tostring(op) }
end
if type(reply) == 'table' and reply.err then
  if string.sub(reply.err, 1, 3) == 'OOM' or string.sub(reply.err, 1, 6) == 'NOPERM' then
    return redis.error_reply(reply.err)
  end
  return { -2, reply.err }
end
local result = '0'
if op == 'incrby' then
  -- The exact decimal: a Lua number would round a value beyond 2^53.
  result = redis.call('GET', resource)
end
redis.call('SET', fence, epoch .. ':' .. seq)
return { 1, result }
