-- Grant a lease and mint its fence in ONE atomic step (DESIGN.md §2.1).
--
-- KEYS[1] lock key, KEYS[2] fence key (same hash slot in the default layout)
-- ARGV[1] holder token
-- ARGV[2] lease ttl in ms
-- ARGV[3] fence mode: "clock" or "counter"
-- ARGV[4] lock value format: "tagged" (TOKEN:FENCE) or "bare" (TOKEN, guide layout)
-- ARGV[5] fence key retention in ms for clock mode ("0" = keep forever)
--
-- Returns {1, fence} when granted (also for a retry with the same token, which
-- returns the fence of that grant instead of minting a new one) or
-- {0, pttl_of_current_holder} when the lock is held by someone else.
--
-- Every read happens before the first write, so a key of the wrong type raises
-- WRONGTYPE before anything is changed.
local token = ARGV[1]
local held = redis.call('GET', KEYS[1])
local last = redis.call('GET', KEYS[2])
if held then
  -- A retry of a grant that already succeeded (its reply was lost): return
  -- the same fence instead of minting another, and restart the lease so it
  -- lasts at least ttl from this retry, which the client measures from.
  local mine = nil
  if ARGV[4] == 'tagged' then
    local prefix = token .. ':'
    if string.sub(held, 1, #prefix) == prefix then
      mine = tonumber(string.sub(held, #prefix + 1))
    end
  elseif held == token and last then
    mine = tonumber(last)
  end
  if mine then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, mine}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end

local fence
if ARGV[3] == 'counter' then
  -- INCR keeps the key compatible with the guide's Python workers.
  fence = redis.call('INCR', KEYS[2])
else
  local last_n = 0
  if last then
    last_n = tonumber(last)
    if not last_n then
      return redis.error_reply('ERR fence key ' .. KEYS[2] .. ' does not hold an integer')
    end
  end
  -- Floor the fence at the server clock in microseconds: if the fence key is
  -- lost (restart without persistence, failover, eviction, expiry) the next
  -- fence is still above every fence issued before, as long as the server
  -- clock does not step back. Values stay below 2^53, exact in Lua doubles.
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  fence = math.max(last_n + 1, now_us)
  local retention = tonumber(ARGV[5])
  -- string.format('%d') because tostring() rounds 16-digit numbers (%.14g).
  if retention > 0 then
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', retention)
  else
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
end

local value = token
if ARGV[4] == 'tagged' then
  value = token .. ':' .. string.format('%d', fence)
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {1, fence}
