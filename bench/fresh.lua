-- bench/fresh.lua: every request a POST with a key never used before.
--   wrk ... -s bench/fresh.lua URL -- RUN_ID BODY_FILE [EXPECT]
-- Keys are RUN_ID-<thread>-<counter>: unique across threads, rounds, runs.

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

setup = common.setup
done = common.done

local counter = 0
local head, tail

function init(args)
   local run = args[1] or "run"
   local body = common.read_file(args[2])
   head = common.head("POST", args[3] or "new", body)
          .. "Idempotency-Key: " .. run .. "-" .. tid .. "-"
   tail = "\r\n\r\n" .. body
end

function request()
   counter = counter + 1
   return head .. counter .. tail
end
