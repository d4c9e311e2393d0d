-- leader_clear: a resigning leader deletes its record
--
-- KEYS[1] the leader record `<prefix>:{<key>}:leader`
-- ARGV[1] the record the leader wrote
--
-- Deletes the record only if it is still ARGV[1] (a newer leader's stays).
-- Returns 1 if deleted, 0 if not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
