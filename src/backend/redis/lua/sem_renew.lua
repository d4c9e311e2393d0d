-- semaphore renew: compare-and-re-arm one permit (renew_permit in renew.lua)
--
-- KEYS[1] permit set   KEYS[2] count (N)
-- ARGV[1] token   ARGV[2] permit ttl ms
--
-- Returns { 1 } when re-armed, { 0 } when the token is no live permit (expired or
-- removed): the permit is lost.
return renew_permit(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
