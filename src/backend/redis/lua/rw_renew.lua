-- read-write lock: re-arm a read or write lease (renew_rw in renew.lua)
--
-- KEYS[1] read leases   KEYS[2] write lease   KEYS[3] waiting writers   KEYS[4] write fence
-- ARGV[1] "r" (read) or "w" (write)  ARGV[2] token  ARGV[3] lease ttl ms
-- ARGV[4] fence ttl ms
--
-- Returns { 1, writers } when re-armed (`writers`: the live waiting writers, other
-- than this token), { 0, 0 } when the token holds no live lease of that kind.
return renew_rw(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
