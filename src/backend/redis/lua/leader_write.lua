-- leader_write: an election's leader writes (or refreshes) its record
--
-- KEYS[1] the leader record `<prefix>:{<key>}:leader`
-- ARGV[1] the record: the term as 40 decimal digits (epoch, then handoff sequence,
--         each zero-padded to 20), then the rest (since, identity)
-- ARGV[2] the record's TTL in ms
--
-- Writes the record unless the stored one has a greater term (a newer leader's
-- record is never overwritten by a stale leader). Returns 1 if written, 0 if not.
local stored = redis.call('GET', KEYS[1])
if stored and string.sub(stored, 1, 40) > string.sub(ARGV[1], 1, 40) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
