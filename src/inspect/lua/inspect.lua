-- inspect: a read-only snapshot of every lockflight name of one key, at one
-- instant of the server's clock. Writes nothing.
--
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue  KEYS[4] queue expiry  KEYS[5] claim
-- KEYS[6] read leases  KEYS[7] write lease  KEYS[8] waiting writers
-- KEYS[9] write fence  KEYS[10] read-write wake queue  KEYS[11] permits
-- KEYS[12] permit count  KEYS[13] semaphore queue  KEYS[14] semaphore queue expiry
-- KEYS[15] leader record (an election's)
-- ARGV[1] the most members read of each sorted set
--
-- Returns { now_ms, now_us, lock, lock_pttl, fence, queue, queue_expiry, claim,
-- claim_pttl, readers, writer, writer_pttl, writers, write_fence, rw_queue,
-- permits, permit_count, sem_queue, sem_queue_expiry, sizes, leader } where every sorted
-- set is a flat member/score list of at most ARGV[1] members (lowest scores
-- first) and `sizes` their ZCARDs. A value of another type raises WRONGTYPE.
local limit = tonumber(ARGV[1]) - 1
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = string.format('%.0f', tonumber(time[1]) * 1000000 + tonumber(time[2]))

local function get(key)
  return redis.call('GET', key)
end
local function zset(key)
  return redis.call('ZRANGE', key, 0, limit, 'WITHSCORES')
end

local sizes = {}
for _, i in ipairs({ 3, 4, 6, 8, 10, 11, 13, 14 }) do
  table.insert(sizes, redis.call('ZCARD', KEYS[i]))
end
return {
  now_ms, now_us,
  get(KEYS[1]), redis.call('PTTL', KEYS[1]), get(KEYS[2]),
  zset(KEYS[3]), zset(KEYS[4]),
  get(KEYS[5]), redis.call('PTTL', KEYS[5]),
  zset(KEYS[6]),
  get(KEYS[7]), redis.call('PTTL', KEYS[7]),
  zset(KEYS[8]), get(KEYS[9]), zset(KEYS[10]),
  zset(KEYS[11]), get(KEYS[12]),
  zset(KEYS[13]), zset(KEYS[14]),
  sizes,
  get(KEYS[15]),
}
