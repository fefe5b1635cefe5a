-- bench/replay.lua: POSTs that repeat a few keys stored beforehand.
--   wrk ... -s bench/replay.lua URL -- KEY_PREFIX NKEYS BODY_FILE [EXPECT]
-- Keys are KEY_PREFIX-1 .. KEY_PREFIX-NKEYS, sent round robin with the very
-- body they were stored with (same fingerprint), so each one is a replay.

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

setup = common.setup
done = common.done

local reqs = {}
local n, i = 0, 0

function init(args)
   local prefix = args[1] or "replay"
   n = tonumber(args[2] or "16")
   local body = common.read_file(args[3])
   local head = common.head("POST", args[4] or "replay", body)

   for k = 1, n do
      reqs[k] = head .. "Idempotency-Key: " .. prefix .. "-" .. k
                .. "\r\n\r\n" .. body
   end

   -- threads start at different keys
   i = tid
end

function request()
   i = i % n + 1
   return reqs[i]
end
