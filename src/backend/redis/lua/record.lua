-- record: an idempotency record (the IdempotencyLayer's stored response) and its
-- fence, fenced by the executor that holds the key's mutex lease and stored
-- only under a token at least as new as the fence
--
-- KEYS[1] the record `<prefix>:{<key>}:idem`, a hash: 'fence' -> "epoch:seq" (the
--         newest token that fenced or stored it), 'response' -> the stored
--         response (absent until one is stored); one key, in the lock's hash tag,
--         so on a Cluster it lives in the lock's cluster slot
-- ARGV[1] the operation: 'fence', 'store' or 'read'
-- ARGV[2] epoch   ARGV[3] seq (decimal u64, no leading zeros; not for 'read')
-- ARGV[4] the retention in ms (not for 'read')
-- ARGV[5] the response ('store' only)
--
-- Returns:
--   fence   { 1 }            fenced: no response stored; the fence now holds the
--                            token and the record lives for the retention
--           { 2, response }  a response is stored; nothing changed
--           { 0 }            stale: the fence holds a newer token; nothing changed
--   store   1 stored (the fence now holds the token), 0 stale (nothing changed)
--   read    the response, or nil
--
-- A value of another type at KEYS[1], or a 'fence' that is no token, fails the
-- script with WRONGTYPE before any write (a value lockflight did not write). Tokens are compared as decimal strings (length first), exact for every
-- u64, as lua/fenced.lua compares them.
local record, op = KEYS[1], ARGV[1]

if op == 'read' then
  return redis.call('HGET', record, 'response')
end

local epoch, seq, retention = ARGV[2], ARGV[3], ARGV[4]
local function less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
local function stale()
  local last = redis.call('HGET', record, 'fence')
  if not last then
    return false
  end
  local le, ls = string.match(last, '^(%d+):(%d+)$')
  if le == nil then
    return redis.error_reply('WRONGTYPE lockflight: the idempotency record holds a foreign fence')
  end
  return less(epoch, le) or (le == epoch and less(seq, ls))
end

if op == 'fence' then
  local stored = redis.call('HGET', record, 'response')
  if stored then
    return { 2, stored }
  end
  local older = stale()
  if type(older) == 'table' then
    return older
  end
  if older then
    return { 0 }
  end
  redis.call('HSET', record, 'fence', epoch .. ':' .. seq)
  redis.call('PEXPIRE', record, retention)
  return { 1 }
elseif op == 'store' then
  local older = stale()
  if type(older) == 'table' then
    return older
  end
  if older then
    return 0
  end
  redis.call('HSET', record, 'fence', epoch .. ':' .. seq, 'response', ARGV[5])
  redis.call('PEXPIRE', record, retention)
  return 1
end
return redis.error_reply('ERR lockflight: unknown record operation ' .. tostring(op))
