-- leader_write: an election's leader writes (or refreshes) its record, and tells the
-- record's observers when it changed
--
-- KEYS[1] the leader record `<prefix>:{<key>}:leader`
-- KEYS[2] its observers `<prefix>:{<key>}:observers`: a sorted set, an observing
--         instance's channel -> its registration's expiry in ms (server TIME),
--         written by `leader_observe.lua`
-- ARGV[1] the record: the term as 40 decimal digits (epoch, then handoff sequence,
--         each zero-padded to 20), then the rest (since, identity)
-- ARGV[2] the record's TTL in ms
-- ARGV[3] the leader message (tag byte 0xFA, then the key; built in Rust)
--
-- Writes the record unless the stored one has a greater term (a newer leader's
-- record is never overwritten by a stale leader). Returns 1 if written, 0 if not.
--
-- A write that changes the record (another record, or one where none is stored: a
-- new leader, a handoff's term, a record written again after it expired; not a
-- refresh of the stored record) publishes ARGV[3] on the channel of every observer
-- whose registration is live, and deletes the expired registrations. A refused
-- PUBLISH (an ACL without that channel) is skipped: that observer reads the record
-- at its next periodic re-read, as after any lost message.
--
-- Reads first (GET, TIME, ZRANGEBYSCORE), then the writes: a foreign value at
-- either key is refused with nothing changed.
local stored = redis.call('GET', KEYS[1])
if stored and string.sub(stored, 1, 40) > string.sub(ARGV[1], 1, 40) then
  return 0
end
local changed = stored ~= ARGV[1]
local now, observers
if changed then
  local time = redis.call('TIME')
  now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
  observers = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if changed then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, channel in ipairs(observers) do
    redis.pcall('PUBLISH', channel, ARGV[3])
  end
end
return 1
