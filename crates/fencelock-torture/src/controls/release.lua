-- Negative controls' lock, correct part: compare-and-delete.
-- KEYS[1] lock key; ARGV[1] the exact lock value granted.
-- Returns 1 released, 0 absent, -1 another holder's.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held then return -1 end
return 0
