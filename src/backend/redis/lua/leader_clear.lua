-- leader_clear: a resigning leader deletes its record, and tells the record's
-- observers
--
-- KEYS[1] the leader record `<prefix>:{<key>}:leader`
-- KEYS[2] its observers `<prefix>:{<key>}:observers` (see `leader_write.lua`)
-- ARGV[1] the record the leader wrote
-- ARGV[2] the leader message (tag byte 0xFA, then the key; built in Rust)
--
-- Deletes the record only if it is still ARGV[1] (a newer leader's stays).
-- Returns 1 if deleted, 0 if not.
--
-- A deletion publishes ARGV[2] on the channel of every observer whose registration
-- is live, and deletes the expired registrations (a refused PUBLISH is skipped, as
-- in `leader_write.lua`). Reads first (GET, TIME, ZRANGEBYSCORE), then the writes.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local time = redis.call('TIME')
local now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
local observers = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
redis.call('DEL', KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
for _, channel in ipairs(observers) do
  redis.pcall('PUBLISH', channel, ARGV[2])
end
return 1
