-- bench/common.lua: what the wrk scripts of bench/run.sh share.
--
-- setup() numbers the threads (the global `tid` in each thread's state);
-- done() prints one machine-readable BENCH line that run.sh parses.  No
-- script defines response(): wrk then counts statuses >= 400 itself
-- (summary.errors.status) without handing every response to Lua, which
-- would cost CPU on the same two cores as the servers under test.

local M = {}
local threads = {}

function M.setup(thread)
   threads[#threads + 1] = thread
   thread:set("tid", #threads)
end

function M.read_file(path)
   local f = assert(io.open(path, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

-- request line and fixed headers, up to (not including) the blank line
function M.head(method, expect, body)
   local s = method .. " " .. wrk.path .. " HTTP/1.1\r\n"
             .. "Host: " .. wrk.host .. ":" .. wrk.port .. "\r\n"
             .. "X-Bench-Expect: " .. expect .. "\r\n"
   if body then
      s = s .. "Content-Type: application/json\r\n"
            .. "Content-Length: " .. #body .. "\r\n"
   end
   return s
end

function M.done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d "
      .. "max_us=%d err_connect=%d err_read=%d err_write=%d err_status=%d "
      .. "err_timeout=%d\n",
      summary.requests, summary.duration,
      summary.requests / (summary.duration / 1000000),
      latency:percentile(50), latency:percentile(99), latency.max,
      e.connect, e.read, e.write, e.status, e.timeout))
end

return M
