#!/usr/bin/env bash
# The HTTP front end against nginx, on loopback, with the same load: wrk, one thread, 64 kept-alive
# connections, --latency. Three pairs:
#   1. GET /healthz               vs nginx `return 200` with the same body;
#   2. POST /v1/completions with an API key no tenant has (sluice's 401 path, which needs the
#      tenants of bench/http/sluice.json) vs an nginx `limit_req` location answering 429. (nginx
#      runs `return` before limit_req, so that location serves a file instead.)
#   3. POST /v1/completions to a tier that rejects everything (bench/http/sluice-429.json:
#      admission's 429 path: the body decoded, classified, tokenized, refused with Retry-After)
#      vs the same nginx `limit_req` 429.
# Each server gets one event loop (sluice io_threads 1, nginx worker_processes 1) and logs every
# request to a file (sluice's access log on stderr, nginx's default access_log). With 2 or more
# CPUs the server runs on the last one and wrk on the others.
#
# NGINX_LOG=buffered gives nginx `access_log ... buffer=64k flush=1s` (sluice writes its access log
# once per event-loop iteration, which is closer to that than to nginx's default); NGINX_LOG=off
# turns nginx's access log off.
#
# Usage: bench/http/run.sh   (env: BUILD=build DURATION=10s CONNS=64 REPS=1 NGINX_LOG=default)
# Installs wrk and nginx if missing (Debian packages; nginx is never started as a service).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
REPS=${REPS:-1}
NGINX_LOG=${NGINX_LOG:-default}
SLUICE=$BUILD/sluice
[ -x "$SLUICE" ] || { echo "bench/http: $SLUICE not found; build first (scripts/setup.sh)" >&2; exit 1; }

# ---- tools ----
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  echo "bench/http: installing ${missing[*]}"
  # The nginx package would start the system-wide service; a policy-rc.d keeps it stopped.
  policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d
    policy_added=1
  fi
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
  if ((policy_added)); then "${sudo[@]}" rm -f /usr/sbin/policy-rc.d; fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# ---- scratch, processes, cleanup ----
tmp=$(mktemp -d /tmp/sluice-bench-http.XXXXXX)
chmod 755 "$tmp" # nginx workers may run as another user
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
  local p=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

wait_up() { # url
  for _ in $(seq 200); do
    if curl -s -o /dev/null "$1"; then return 0; fi
    sleep 0.05
  done
  echo "bench/http: $1 did not come up" >&2
  return 1
}

ncpu=$(nproc)
server_cpu=() wrk_cpu=()
if ((ncpu >= 2)) && command -v taskset >/dev/null; then
  server_cpu=(taskset -c $((ncpu - 1)))
  wrk_cpu=(taskset -c "0-$((ncpu - 2))")
fi

# ---- nginx: its own minimal configuration ----
nginx_port=$(free_port 18181)
case "$NGINX_LOG" in
default) nginx_log="access_log $tmp/nginx-access.log;" ;;
buffered) nginx_log="access_log $tmp/nginx-access.log combined buffer=64k flush=1s;" ;;
off) nginx_log="access_log off;" ;;
*) echo "bench/http: NGINX_LOG must be default, buffered or off" >&2; exit 1 ;;
esac
printf '{"status":"ok"}' >"$tmp/healthz.json"
printf '{"error":{"message":"rate limited","type":"rate_limit_error","param":null,"code":null}}' \
  >"$tmp/limited.json"
mkdir -p "$tmp/html"
cp "$tmp/limited.json" "$tmp/html/limited.json"
chmod -R a+rX "$tmp"
cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 4096; }
http {
  $nginx_log
  client_body_temp_path $tmp/body;
  proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fastcgi;
  uwsgi_temp_path $tmp/uwsgi;
  scgi_temp_path $tmp/scgi;
  keepalive_requests 100000000;
  keepalive_timeout 60s;
  # One request a minute per server: after the first, every request is over the limit.
  limit_req_zone \$server_name zone=bench:1m rate=1r/m;
  limit_req_status 429;
  server {
    listen 127.0.0.1:$nginx_port backlog=4096;
    server_name bench;
    location = /healthz {
      default_type application/json;
      return 200 '{"status":"ok"}';
    }
    location = /v1/completions {
      limit_req zone=bench nodelay;
      default_type application/json;
      root $tmp/html;
      try_files /limited.json =404;
    }
  }
}
EOF
"$NGINX" -t -q -p "$tmp" -c "$tmp/nginx.conf" 2>"$tmp/nginx-test.log" ||
  { cat "$tmp/nginx-test.log" >&2; exit 1; }

start_nginx() {
  "${server_cpu[@]}" "$NGINX" -p "$tmp" -c "$tmp/nginx.conf" &
  nginx_pid=$!
  pids+=("$nginx_pid")
  wait_up "http://127.0.0.1:$nginx_port/healthz"
}

stop_nginx() { stop_pid "$nginx_pid" QUIT; }

# Stops a process started in the background; when $! was a shell that did not exec, the
# server is its child.
stop_pid() { # pid signal
  local target=$1
  case "$(ps -o comm= -p "$1" 2>/dev/null)" in
  bash | sh) target=$(pgrep -P "$1" || echo "$1") ;;
  esac
  kill "-$2" $target 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# ---- sluice ----
sluice_port=$(free_port 18180)
start_sluice() { # extra args...
  "${server_cpu[@]}" "$SLUICE" --listen "127.0.0.1:$sluice_port" "$@" 2>>"$tmp/sluice.log" &
  sluice_pid=$!
  pids+=("$sluice_pid")
  wait_up "http://127.0.0.1:$sluice_port/healthz"
}

stop_sluice() { stop_pid "$sluice_pid" TERM; }

# ---- wrk ----
cat >"$tmp/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"prompt":"Hello","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-not-a-tenant"
EOF

# CPU time (user + system, in clock ticks) of a process and its children (nginx's workers).
cpu_ticks() { # pid
  local t=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    if [ -r "/proc/$p/stat" ]; then
      t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    fi
  done
  echo "$t"
}
hz=$(getconf CLK_TCK)

# Runs wrk against the server whose pid is given; prints "REQ_PER_S P99_MS NON2XX CPU_US_PER_REQ".
# The CPU time the server spent per request does not depend on what else the machine runs, so
# it compares the two servers better than req/s on a shared VM.
measure() { # pid url [lua]
  local pid=$1 url=$2 script=() out c0 c1
  if [ $# -gt 2 ]; then script=(-s "$3"); fi
  # Warm-up, not recorded.
  "${wrk_cpu[@]}" wrk -t1 -c"$CONNS" -d2s "${script[@]}" "$url" >/dev/null
  c0=$(cpu_ticks "$pid")
  out=$("${wrk_cpu[@]}" wrk -t1 -c"$CONNS" -d"$DURATION" --latency "${script[@]}" "$url")
  c1=$(cpu_ticks "$pid")
  echo "$out" >>"$tmp/wrk.log"
  local rps p99 non2xx n cpu
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
               if (u == "us") v /= 1000; else if (u == "s") v *= 1000; printf "%.2f", v}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' <<<"$out")
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  cpu=$(awk -v t=$((c1 - c0)) -v hz="$hz" -v n="$n" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
  echo "$rps $p99 ${non2xx:-0} $cpu"
}

printf '\nsluice vs nginx, wrk -t1 -c%s -d%s --latency, keep-alive, 127.0.0.1, %s CPUs%s,' \
  "$CONNS" "$DURATION" "$ncpu" "${server_cpu:+ (server pinned to CPU $((ncpu - 1)))}"
printf ' nginx access log: %s\n' "$NGINX_LOG"
printf '%-38s %-7s %10s %8s %9s %12s\n' "pair" "server" "req/s" "p99 ms" "non-2xx" "CPU us/req"
row() { printf '%-38s %-7s %10s %8s %9s %12s\n' "$1" "$2" "$3" "$4" "$5" "$6"; }

compare() { # s_rps s_p99 s_cpu n_rps n_p99 n_cpu
  local ratio verdict cpu
  ratio=$(awk -v s="$1" -v n="$4" 'BEGIN {printf "%.2f", s / n}')
  cpu=$(awk -v s="$3" -v n="$6" 'BEGIN {printf "%.2f", s / n}')
  verdict=$(awk -v sr="$1" -v sp="$2" -v nr="$4" -v np="$5" \
    'BEGIN {print (sr >= nr && sp <= np) ? "meets" : "misses"}')
  printf '%-38s %-7s %10s %8s %9s %12s  sluice/nginx; %s the target (req/s >= 1.0x, p99 <= nginx)\n' \
    "" "ratio" "${ratio}x" "" "" "${cpu}x"  "$verdict"
}

# With sluice started: measures it on PATH (wrk script LUA, if given), stops it, measures nginx on
# the same path, and prints the pair.
pair() { # label nginx_label path [lua]
  read -r s_rps s_p99 s_bad s_cpu < <(measure "$sluice_pid" "http://127.0.0.1:$sluice_port$3" \
    ${4:+"$4"})
  stop_sluice
  start_nginx
  read -r n_rps n_p99 n_bad n_cpu < <(measure "$nginx_pid" "http://127.0.0.1:$nginx_port$3" \
    ${4:+"$4"})
  stop_nginx
  row "$1" sluice "$s_rps" "$s_p99" "$s_bad" "$s_cpu"
  row "  vs $2" nginx "$n_rps" "$n_p99" "$n_bad" "$n_cpu"
  compare "$s_rps" "$s_p99" "$s_cpu" "$n_rps" "$n_p99" "$n_cpu"
}

# A POST pair against nginx's limit_req 429: sluice on CONFIG must first answer EXPECT to the
# probe (with HEADER, if any), else the pair is skipped with WHY.
post_pair() { # label config expect header why
  if ! "$SLUICE" --check-config "$2" >"$tmp/check.log" 2>&1; then
    row "$1" sluice "skipped" "" "" ""
    echo "  this sluice refuses $2: $(tail -1 "$tmp/check.log")"
    return
  fi
  start_sluice --config "$2"
  status=$(curl -s -o /dev/null -w '%{http_code}' -X POST ${4:+-H "$4"} \
    -d '{"prompt":"Hello","max_tokens":1}' "http://127.0.0.1:$sluice_port/v1/completions")
  if [ "$status" != "$3" ]; then
    stop_sluice
    row "$1" sluice "skipped" "" "" ""
    echo "  $5 (HTTP $status, not $3)"
    return
  fi
  pair "$1" "nginx limit_req 429" /v1/completions "$tmp/post.lua"
}

for rep in $(seq "$REPS"); do
  # Pair 1: /healthz.
  start_sluice
  pair "GET /healthz (run $rep)" "nginx return 200" /healthz
  # Pair 2: the 401 of an unknown key against nginx's limit_req 429.
  post_pair "POST /v1/completions 401 (run $rep)" bench/http/sluice.json 401 \
    'Authorization: Bearer sk-not-a-tenant' "an unknown key was not refused"
  # Pair 3: admission's 429 for a tier that takes nothing, against the same limit_req 429.
  post_pair "POST /v1/completions 429 (run $rep)" bench/http/sluice-429.json 429 "" \
    "a closed tier did not answer 429"
done
echo
echo "req/s and p99 on a shared VM move by tens of percent between runs (other processes take"
echo "the CPUs): run REPS=3 and compare pairs; CPU us/req (the server's own CPU time per request)"
echo "is the steadier figure."
