-- Release, when the lock is ours and someone waits (after
-- release_free.lua, fence_clock.lua and fast_helpers.lua; prepended to
-- common.lua, prelude.lua and release.lua): with clock fences and a head
-- waiter whose lease has not ended, the head is woken (a notify head: DEL,
-- PUBLISH) or handed the lock (a fair head, or a notify head that has
-- waited the starvation threshold: the fence minted and stored, the head
-- dequeued, the lock set to it, PUBLISH), as release.lua's pass_on does,
-- in 6 and 10 calls against its 11 and 15, and before the shared helpers
-- are created (see fence_clock.lua). The hand-over is what a contended
-- lock waits for: its Redis time is the hand-over's.
-- Anything else (not ours, a dead head, a fence key that is not a
-- canonical integer, counter fences, an error) falls through to the full
-- script, which reads again and decides, naming what is wrong. A call
-- falls through only before it changed the lock: by then it may have
-- stored a fence (the full script mints a higher one; fences need only
-- grow) or dropped the head's waiter lease (the full script then finds the
-- head dead and dequeues it, as it would have, naming what fails).
do
  local lock = KEYS[1]
  local queue = lock .. ':queue'
  local first = type(free_waiting) == 'number' and free_waiting > 0
    and redis.pcall('ZRANGE', queue, 0, 0, 'WITHSCORES')
  local head = type(first) == 'table' and not first.err and first[1]
  if head and string.byte(ARGV[1], 1) == MINT_CLOCK then
    local client, waiter, wmode, ttl, handover, token =
      string.match(head, '^([^:]+):([^:]+):(%a+):(%d+):(%d+):(.+)$')
    local waiters = lock .. ':waiters'
    local lease_end = token and redis.pcall('ZSCORE', waiters, head)
    local t = type(lease_end) == 'string' and redis.pcall('TIME')
    local now = t and not t.err and t[1] * 1000000 + t[2]
    if now and tonumber(lease_end) > math.floor(now / 1000) then
      local publish, starving = string.match(ARGV[1], ' (%u+) (%d+)$')
      local channel = lock .. ':wake:' .. client
      if wmode ~= 'fair' and now - tonumber(first[2]) < tonumber(starving) then
        -- Wake the head; it takes the lock with its own grant, unless
        -- another caller is quicker (notify).
        if redis.pcall('DEL', lock) == 1 then
          redis.pcall(publish, channel, waiter)
          return 1
        end
      else
        local n = fast_last_fence(lock)
        -- Until the new holder renews (at once), the lease lasts only its
        -- hand-over lease (see prelude.lua's pass_on); a member whose
        -- lease is not a usable PX takes the full script.
        local px = math.min(tonumber(ttl), tonumber(handover))
        if n and px >= 1 and px < 9007199254740991 then
          local f = clock_fence(n, now)
          local fs = string.format('%d', f)
          local stored = fast_store_fence(lock, fs, ARGV[1])
          if not stored.err
            and redis.pcall('ZREM', waiters, head) == 1
            and redis.pcall('ZREM', queue, head) == 1 then
            local v = token
            if string.byte(ARGV[1], 2) == MINT_TAGGED then v = v .. ':' .. fs end
            local set = redis.pcall('SET', lock, v, 'PX', string.format('%d', px))
            if type(set) == 'table' and set.err then error(set) end
            redis.pcall(publish, channel, waiter .. ' ' .. fs)
            return 1
          end
        end
      end
    end
  end
end
