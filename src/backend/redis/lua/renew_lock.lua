-- mutex renew: compare-and-PEXPIRE (renew_lock in renew.lua)
--
-- KEYS[1] lock   KEYS[2] fence   KEYS[3] queue   KEYS[4] queue expiry index
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] fence ttl ms  ARGV[4] instance id
--
-- Returns { 1, others } when renewed, { 0, 0 } when the token does not own the lock.
return renew_lock(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
