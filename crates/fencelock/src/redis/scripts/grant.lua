-- Grant a lease and mint its fence in ONE atomic step (DESIGN.md §2.1), and
-- keep the wait queue used by the notify and fair wait modes.
--
-- KEYS[1] lock key, KEYS[2] fence key,
-- KEYS[3] wait queue (zset: member -> arrival time in µs),
-- KEYS[4] waiter leases (zset: member -> lease end in ms)
-- (all four share one hash slot in the default layout)
-- ARGV[1] holder token
-- ARGV[2] lease ttl in ms
-- ARGV[3] fence mode: "clock" or "counter"
-- ARGV[4] lock value format: "tagged" (TOKEN:FENCE) or "bare" (TOKEN, guide layout)
-- ARGV[5] fence key retention in ms for clock mode ("0" = keep forever)
-- ARGV[6] wait mode: "poll", "notify" or "fair"
-- ARGV[7] waiter id in the queue ("CLIENT:WAITER"), or "" for a single try
-- ARGV[8] waiter lease in ms
--
-- Returns {1, fence} when granted (also for a retry with the same token, which
-- returns the fence of that grant instead of minting a new one),
-- {0, pttl_of_current_holder} when the lock is held by someone else, or
-- {0, -3} when the lock is free but reserved for the head of a fair queue.
-- In notify and fair mode a refused caller is queued (or its place renewed).
--
-- The lock and fence keys are read before the first write, so a key of the
-- wrong type raises WRONGTYPE before anything is changed.
local token = ARGV[1]
local mode = ARGV[6]
local held = redis.call('GET', KEYS[1])
local last = redis.call('GET', KEYS[2])

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Drops waiters whose lease ended (crashed or gone without leaving).
local function purge(now_ms)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms)
  if #dead > 0 then
    redis.call('ZREM', KEYS[3], unpack(dead))
    redis.call('ZREM', KEYS[4], unpack(dead))
  end
end

-- Queues the caller at the back (or keeps its place) and renews its lease.
-- A caller without a waiter id (a single try) is never queued.
local function enqueue(now)
  if ARGV[7] == '' then return end
  local lease = tonumber(ARGV[8])
  if not redis.call('ZSCORE', KEYS[3], ARGV[7]) then
    redis.call('ZADD', KEYS[3], now, ARGV[7])
  end
  redis.call('ZADD', KEYS[4], math.floor(now / 1000) + lease, ARGV[7])
  redis.call('PEXPIRE', KEYS[3], lease * 2)
  redis.call('PEXPIRE', KEYS[4], lease * 2)
end

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
  if mode ~= 'poll' then
    local now = now_us()
    purge(math.floor(now / 1000))
    enqueue(now)
  end
  return {0, redis.call('PTTL', KEYS[1])}
end

if mode == 'fair' then
  local now = now_us()
  purge(math.floor(now / 1000))
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= ARGV[7] then
    enqueue(now)
    return {0, -3}
  end
end

-- The fence key must hold a plain non-negative decimal integer, as fencelock
-- and the guide's INCR write it. Refuse anything else before the first
-- write: tonumber() accepts '1.5', '0x10', ' 7', '1e3', 'inf' and 'nan'
-- (string.format('%d') of nan yields i64::MIN), and INCR accepts '-5'.
if last and not string.match(last, '^%d+$') then
  return redis.error_reply('ERR fence key ' .. KEYS[2] .. ' does not hold an integer')
end

local fence
if ARGV[3] == 'counter' then
  -- INCR keeps the key compatible with the guide's Python workers.
  fence = redis.call('INCR', KEYS[2])
  -- A counter must never expire (a name once used in clock mode has a
  -- fence key with a ttl).
  redis.call('PERSIST', KEYS[2])
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
  -- Above 2^53 doubles cannot count by one: refuse rather than repeat.
  if last_n >= 9007199254740991 then
    return redis.error_reply('ERR fence key ' .. KEYS[2] .. ' is at or above 2^53 - 1; fences cannot grow further')
  end
  fence = math.max(last_n + 1, now_us())
  -- string.format('%d') because tostring() rounds 16-digit numbers (%.14g).
  if ARGV[5] ~= '0' then
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[5])
  else
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
end

local value = token
if ARGV[4] == 'tagged' then
  value = token .. ':' .. string.format('%d', fence)
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
if mode ~= 'poll' then
  redis.call('ZREM', KEYS[3], ARGV[7])
  redis.call('ZREM', KEYS[4], ARGV[7])
end
return {1, fence}
