-- leader_observe: an instance registers (or refreshes) itself as an observer of an
-- election's leader record
--
-- KEYS[1] the record's observers `<prefix>:{<key>}:observers`: a sorted set, an
--         observing instance's channel -> its registration's expiry in ms (server
--         TIME); read by `leader_write.lua` and `leader_clear.lua`
-- ARGV[1] the observing instance's channel `<prefix>:inst:<id>`
-- ARGV[2] the registration's TTL in ms
--
-- Sets ARGV[1]'s expiry to now + ARGV[2], deletes the expired registrations, and
-- keeps the set alive at least as long as this registration, so that a set nobody
-- observes any more leaves no key behind. Returns 1.
--
-- ZADD is the first write: a foreign value at KEYS[1] is refused before anything
-- changes.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
