-- fenced write: apply one small write to a resource only if the offered fencing
-- token is not older than the last one the resource accepted (equal tokens are the
-- same critical section, which may write several times; tokens are unique per
-- critical section), and, for a write that carries a write id, only if that id
-- has not been applied under this token already (a repeat after a lost reply).
--
-- KEYS[1] the resource   KEYS[2] its fence   KEYS[3] its write record, given only
--   with a write id (all in one cluster slot; see fence/redis.rs)
-- ARGV[1] epoch   ARGV[2] seq (decimal u64, no leading zeros)
-- ARGV[3] the write id: 16 lowercase hex digits, or '' for a write without one
-- ARGV[4] the operation:
--   'set'     ARGV[5] value                 SET resource value
--   'setpx'   ARGV[5] value  ARGV[6] ms     SET resource value PX ms
--   'incrby'  ARGV[5] delta                 INCRBY resource delta (replies the new value)
--   'hset'    ARGV[5..] field value ...     HSET resource field value ...
--   'del'                                   DEL resource
--   'advance'                               nothing but the fence (never with an id)
--
-- The write record is a hash: 'token' -> "epoch:seq" (whose ids it holds),
-- 'mark' -> the greatest id dropped so far ('' for none), and one field per
-- applied id -> the write's result. It keeps the newest KEEP ids (by id order,
-- which is creation order: fence/write.rs) and drops the older ones when it holds
-- more than TRIM. An id not recorded and not greater than the mark cannot be told
-- from a dropped one, so it is refused, never applied: no id applies twice. A
-- write with a newer token starts a new record; a record of another token is not
-- this token's (an older lockflight moved the fence without it).
--
-- Returns:
--   { 1, result }              applied (result: the value INCRBY made, as a
--                              string, else '0'); the fence now holds "epoch:seq"
--                              and the record the id
--   { 2, result }              already applied: the id is recorded under this
--                              token; nothing changed; result as it was then
--   { 0, last_epoch, last_seq } stale: the offered token is older than the last
--                              accepted one; nothing changed
--   { -1, role }               the resource, the fence or the write record holds a
--                              value of another type (role names which); nothing
--                              changed
--   { -2, detail }             the operation failed (INCRBY on a non-integer, …),
--                              or the id is too old to tell (detail 'WRITEID …');
--                              nothing changed
--
-- Reads first, then the resource's write, then the fence's, then the record's:
-- Redis does not roll a script back, so every check that can fail comes before
-- the first write; the resource's command is the only one that can still fail
-- (and then changes nothing); under maxmemory with noeviction Redis refuses a
-- script at its first write, never at a later one, so an applied write always
-- records its token and its id, and a token or an id is never recorded without
-- its write. Tokens are compared as decimal strings (length first), exact for
-- every u64; ids as fixed-width hex strings.
local KEEP, TRIM = 64, 96
local resource, fence, record = KEYS[1], KEYS[2], KEYS[3]
local epoch, seq, id, op = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local token = epoch .. ':' .. seq

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

local fresh = false
if id ~= '' then
  if record == nil or op == 'advance' or #id ~= 16 or not string.match(id, '^[0-9a-f]+$') then
    return { -2, 'ERR a write id needs the write record key and 16 hex digits' }
  end
  local owner = redis.pcall('HGET', record, 'token')
  if type(owner) == 'table' and owner.err then
    return { -1, 'write record' }
  end
  if owner == token then
    local done = redis.call('HGET', record, id)
    if done then
      return { 2, done }
    end
    local mark = redis.call('HGET', record, 'mark')
    if mark and id <= mark then
      return { -2, 'WRITEID write id ' .. id .. ' is older than the ids still recorded'
        .. ' under token ' .. token .. ': whether it was applied cannot be told' }
    end
  else
    fresh = true
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
  reply = redis.pcall('SET', resource, ARGV[5])
elseif op == 'setpx' then
  reply = redis.pcall('SET', resource, ARGV[5], 'PX', ARGV[6])
elseif op == 'incrby' then
  reply = redis.pcall('INCRBY', resource, ARGV[5])
elseif op == 'hset' then
  reply = redis.pcall('HSET', resource, unpack(ARGV, 5))
elseif op == 'del' then
  reply = redis.pcall('DEL', resource)
elseif op == 'advance' then
  reply = 0
else
  return { -2, 'ERR unknown operation ' .. tostring(op) }
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
redis.call('SET', fence, token)
if id ~= '' then
  if fresh then
    redis.call('DEL', record)
    redis.call('HSET', record, 'token', token, 'mark', '')
  end
  redis.call('HSET', record, id, result)
  if redis.call('HLEN', record) - 2 > TRIM then
    local ids = {}
    for _, field in ipairs(redis.call('HKEYS', record)) do
      if field ~= 'token' and field ~= 'mark' then
        ids[#ids + 1] = field
      end
    end
    table.sort(ids)
    local drop = #ids - KEEP
    redis.call('HDEL', record, unpack(ids, 1, drop))
    redis.call('HSET', record, 'mark', ids[drop])
  end
end
return { 1, result }
