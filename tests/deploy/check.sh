#!/usr/bin/env bash
# Checks deploy/ offline, with the built sluice (meson test deploy runs it):
#   nginx    `nginx -t` on deploy/nginx/sluice.conf included in an http {} block; the SSE and
#            limit settings it must keep; then nginx with it in front of a real sluice on
#            loopback (a stream, both key headers, a 401, /metrics refused: nginx-smoke.mjs)
#   systemd  `systemd-analyze verify` and `systemd-analyze security --offline` (exposure at most
#            2.0) on deploy/systemd/sluice.service with ExecStart pointing at this build;
#            its flags through `sluice --check-config`; the settings tied to conf/sluice.json
#            (TimeoutStopSec above drain_timeout_ms, LimitNOFILE above max_connections);
#            `systemd-sysusers --root` on deploy/systemd/sluice.sysusers
#   k8s      every manifest of deploy/k8s against the Kubernetes schemas of the pinned
#            kubernetes-models (tests/deploy/package-lock.json, installed by scripts/setup.sh),
#            strictly, and the deployment's promises (k8s.mjs); the Secret's sluice.json through
#            `sluice --check-config`
#   grafana  deploy/grafana/sluice.json's shape, and every metric its expressions name in a live
#            /metrics of this build's sluice (grafana.mjs)
# A tool that is not installed is skipped with a message (scripts/setup.sh installs them all);
# Node and the npm packages are required, as for tests/sdk.
#
# usage: check.sh SOURCE_ROOT SLUICE_BIN
# Prints "ok:", "FAIL:" or "SKIP:" per check and closes with "deploy: N passed, M failed, K
# skipped"; exits 1 when any check failed.
set -uo pipefail
root=${1:?usage: check.sh SOURCE_ROOT SLUICE_BIN}
sluice=${2:?usage: check.sh SOURCE_ROOT SLUICE_BIN}
sluice=$(realpath "$sluice")
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

passed=0 failed=0 skipped=0
pass() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }
# expect WHAT COMMAND...: pass when COMMAND exits 0, else fail showing its output.
expect() {
  local what=$1 out
  shift
  if out=$("$@" 2>&1); then pass "$what"; else fail "$what"; printf '%s\n' "$out" | sed 's/^/    /'; fi
}

have_node=0
if command -v node >/dev/null 2>&1; then have_node=1; fi
# conf KEY: the default of KEY, from the documented example configuration.
conf() {
  node -e 'const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
           console.log(c[process.argv[2]])' "$root/conf/sluice.json" "$1"
}
if ((have_node)); then
  drain_ms=$(conf drain_timeout_ms) max_body=$(conf max_body_bytes)
  idle_ms=$(conf idle_timeout_ms) max_conns=$(conf max_connections)
else
  fail "node is not installed (scripts/setup.sh installs it)"
  drain_ms=30000 max_body=1048576 idle_ms=60000 max_conns=4096
fi

# --- nginx --------------------------------------------------------------------------------------
nginx_conf=$root/deploy/nginx/sluice.conf
nginx=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)
# nginx_wrapper FILE EXTRA_MAIN: an nginx.conf that includes FILE in http {}, every path in $tmp.
nginx_wrapper() {
  mkdir -p "$tmp/nginx"
  cat <<EOF
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log;
$2
events { worker_connections 64; }
http {
    access_log $tmp/nginx/access.log;
    client_body_temp_path $tmp/nginx/client_body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    include $1;
}
EOF
}
if [ -z "$nginx" ]; then
  skip "nginx: not installed (scripts/setup.sh installs Debian's nginx): nginx -t and the smoke test not run"
else
  nginx_wrapper "$nginx_conf" "" >"$tmp/nginx-t.conf"
  expect "nginx: $("$nginx" -v 2>&1 | sed 's/.*version: //') -t accepts deploy/nginx/sluice.conf inside http {}" \
    "$nginx" -t -q -p "$tmp/nginx" -c "$tmp/nginx-t.conf" -e "$tmp/nginx/error.log"
fi

# What the file must keep, whatever nginx accepts: SSE unbuffered, keep-alive to the replicas,
# sluice's limits. Comments are stripped first.
code=$(sed 's/#.*//' "$nginx_conf")
has() { grep -Eq "$1" <<<"$code"; }
problems=()
has '^\s*upstream\s+sluice\s*\{' || problems+=("no upstream sluice")
has '^\s*keepalive\s+[0-9]+;' || problems+=("no keepalive in the upstream")
has '^\s*proxy_http_version\s+1\.1;' || problems+=("proxy_http_version 1.1 missing")
has '^\s*proxy_set_header\s+Connection\s+"";' || problems+=('proxy_set_header Connection "" missing')
has '^\s*proxy_buffering\s+off;' || problems+=("proxy_buffering off missing")
has '^\s*proxy_cache\s+off;' || problems+=("proxy_cache off missing")
read_s=$(sed -nE 's/^\s*proxy_read_timeout\s+([0-9]+)s?;.*/\1/p' <<<"$code" | head -1)
[ "${read_s:-0}" -ge 600 ] || problems+=("proxy_read_timeout ${read_s:-unset} s: below 600 s")
body=$(sed -nE 's/^\s*client_max_body_size\s+([0-9]+[kKmM]?);.*/\1/p' <<<"$code" | head -1)
case $body in
  *[kK]) body=$((${body%?} * 1024)) ;;
  *[mM]) body=$((${body%?} * 1048576)) ;;
esac
[ "${body:-0}" = "$max_body" ] || problems+=("client_max_body_size ${body:-unset} is not max_body_bytes $max_body")
ka=$(sed -nE 's/^\s*keepalive_timeout\s+([0-9]+)s?;.*/\1/p' <<<"$code" | head -1)
[ -n "$ka" ] && [ $((ka * 1000)) -lt "$idle_ms" ] ||
  problems+=("upstream keepalive_timeout ${ka:-unset} s must be below idle_timeout_ms $idle_ms")
if ((${#problems[@]} == 0)); then
  pass "nginx: SSE-safe proxying and sluice's limits (max_body_bytes $max_body, idle_timeout_ms $idle_ms)"
else
  fail "nginx: $(IFS=';'; echo "${problems[*]}")"
fi

# A free loopback port, as the kernel hands one out (nginx cannot be told to pick one).
free_port() {
  node -e 'const s = require("net").createServer();
           s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
# start_sluice CONFIG: starts sluice on a port of its choosing; sets sluice_pid and sluice_port.
start_sluice() {
  "$sluice" --config "$1" --listen 127.0.0.1:0 --model synthetic >"$tmp/sluice.log" 2>&1 &
  sluice_pid=$!
  pids+=("$sluice_pid")
  sluice_port=
  for _ in $(seq 300); do
    sluice_port=$(sed -nE 's|.*listening on http://127\.0\.0\.1:([0-9]+).*|\1|p' "$tmp/sluice.log")
    [ -n "$sluice_port" ] && return 0
    kill -0 "$sluice_pid" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

# --- k8s ----------------------------------------------------------------------------------------
k8s_ok=0
if ((!have_node)); then
  fail "k8s: node is not installed (scripts/setup.sh installs it)"
elif [ ! -f "$root/tests/deploy/node_modules/kubernetes-models/package.json" ]; then
  fail "k8s: tests/deploy/node_modules is missing: run scripts/setup.sh (npm ci in tests/deploy)"
else
  mkdir -p "$tmp/k8s"
  if out=$(node "$root/tests/deploy/k8s.mjs" "$root/deploy/k8s" "$tmp/k8s" 2>&1); then
    pass "k8s: $(head -1 <<<"$out"): every manifest valid, strictly, and the deployment's promises hold"
    k8s_ok=1
  else
    fail "k8s: deploy/k8s"
  fi
  printf '%s\n' "$out" | sed 's/^/    /'
  if ((k8s_ok)); then
    # The listen address is the pod's; here any free port will do (flags override the file).
    expect "k8s: the Secret's sluice.json passes sluice --check-config" \
      "$sluice" --check-config "$tmp/k8s/sluice.json" --listen 127.0.0.1:0
  fi
fi

# --- nginx in front of a real sluice -------------------------------------------------------------
if [ -z "$nginx" ]; then
  : # skipped above
elif ((!k8s_ok)); then
  fail "nginx: smoke test not run: it uses deploy/k8s's configuration, which did not pass"
elif ! start_sluice "$tmp/k8s/sluice.json"; then
  fail "nginx: smoke test: sluice did not start"
  sed 's/^/    /' "$tmp/sluice.log"
else
  nginx_port=$(free_port)
  # The example upstream's three replicas become this one sluice; the listener goes to loopback.
  awk -v s="$sluice_port" -v l="$nginx_port" '
    /^[[:space:]]*server[[:space:]]+127\.0\.0\.1:[0-9]+/ {
      if (!done++) { sub(/127\.0\.0\.1:[0-9]+/, "127.0.0.1:" s); print }
      next
    }
    /^[[:space:]]*listen[[:space:]]+[0-9]+;/ { sub(/[0-9]+;/, "127.0.0.1:" l ";") }
    { print }' "$nginx_conf" >"$tmp/sluice-run.conf"
  nginx_wrapper "$tmp/sluice-run.conf" "daemon off; master_process off;" >"$tmp/nginx-run.conf"
  "$nginx" -p "$tmp/nginx" -c "$tmp/nginx-run.conf" -e "$tmp/nginx/error.log" &
  nginx_pid=$!
  pids+=("$nginx_pid")
  for _ in $(seq 100); do
    [ -s "$tmp/nginx/nginx.pid" ] && break
    sleep 0.1
  done
  if out=$(node "$root/tests/deploy/nginx-smoke.mjs" "http://127.0.0.1:$nginx_port" \
             sk-example-change-me 2>&1); then
    pass "nginx: sluice behind deploy/nginx/sluice.conf serves a stream and both key headers"
  else
    fail "nginx: sluice behind deploy/nginx/sluice.conf"
    sed 's/^/    /' "$tmp/nginx/error.log"
  fi
  printf '%s\n' "$out" | sed 's/^/    /'
  # SIGTERM drains and exits 0, as the unit and the Deployment expect.
  kill -TERM "$sluice_pid"
  wait "$sluice_pid"
  rc=$?
  if [ "$rc" -eq 0 ]; then pass "sluice exits 0 on SIGTERM after the drain"; else fail "sluice exited $rc on SIGTERM"; fi
fi

# --- grafana ------------------------------------------------------------------------------------
# deploy/grafana/sluice.json's shape, then every metric its PromQL names against a live scrape of
# a sluice with a fleet (a Redis of its own on loopback, for sluice:redis_up), prices, a budget
# and an rpm-1 tenant, after requests that give every family samples (grafana.mjs).
grafana=$root/deploy/grafana/sluice.json
if ((!have_node)); then
  fail "grafana: node is not installed (scripts/setup.sh installs it)"
elif ! command -v redis-server >/dev/null 2>&1; then
  expect "grafana: deploy/grafana/sluice.json's shape" node "$root/tests/deploy/grafana.mjs" "$grafana"
  skip "grafana: redis-server not installed (scripts/setup.sh installs it): the expressions were not checked against a live /metrics"
else
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    >"$tmp/redis.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
  # The keys are tests/integration/harness.h's ALICE and CAROL.
  cat >"$tmp/grafana.json" <<EOF
{"threads": 1, "price": {"input_per_mtok": 1, "output_per_mtok": 2},
 "redis": {"url": "redis://127.0.0.1:$redis_port"},
 "tenants": [
  {"name": "alice", "key_sha256": "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe",
   "tiers": ["interactive", "batch"], "default_tier": "interactive",
   "budget": {"amount": 10, "period": "day"}},
  {"name": "carol", "key_sha256": "ce548d28bf71aa9d30cf3e8667a790d9244416b551883d5c1d8753b04686d643",
   "tiers": ["interactive"], "default_tier": "interactive", "rpm": 1}]}
EOF
  if ! start_sluice "$tmp/grafana.json"; then
    fail "grafana: sluice did not start"
    sed 's/^/    /' "$tmp/sluice.log"
  else
    if out=$(node "$root/tests/deploy/grafana.mjs" "$grafana" "http://127.0.0.1:$sluice_port" \
               sk-alice-0123456789abcdefXYZ sk-carol-0123456789abcdefXYZ 2>&1); then
      pass "grafana: deploy/grafana/sluice.json is well formed and names only metrics sluice exports"
    else
      fail "grafana: deploy/grafana/sluice.json"
    fi
    printf '%s\n' "$out" | sed 's/^/    /'
    kill -TERM "$sluice_pid"
    wait "$sluice_pid"
  fi
fi

# --- systemd ------------------------------------------------------------------------------------
unit=$root/deploy/systemd/sluice.service
# Settings a reader of the unit relies on, and those tied to sluice's configuration.
problems=()
val() { sed -nE "s/^$1=(.*)$/\1/p" "$unit" | tail -1; }
[ "$(val ExecStart)" = "/usr/local/bin/sluice --config /etc/sluice/sluice.json" ] ||
  problems+=("ExecStart is not /usr/local/bin/sluice --config /etc/sluice/sluice.json")
[ "$(val ExecReload)" = '/bin/kill -HUP $MAINPID' ] || problems+=('ExecReload is not /bin/kill -HUP $MAINPID')
[ "$(val KillSignal)" = SIGTERM ] || problems+=("KillSignal is not SIGTERM")
stop=$(val TimeoutStopSec)
case $stop in
  *min) stop_s=$((${stop%min} * 60)) ;;
  *s) stop_s=${stop%s} ;;
  *) stop_s=$stop ;;
esac
[[ "$stop_s" =~ ^[0-9]+$ ]] && [ $((stop_s * 1000)) -gt "$drain_ms" ] ||
  problems+=("TimeoutStopSec $stop must exceed drain_timeout_ms $drain_ms")
nofile=$(val LimitNOFILE)
[[ "$nofile" =~ ^[0-9]+$ ]] && [ "$nofile" -gt "$max_conns" ] ||
  problems+=("LimitNOFILE $nofile must exceed max_connections $max_conns")
for s in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
         CapabilityBoundingSet= 'RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX' \
         MemoryDenyWriteExecute=yes LockPersonality=yes ProtectKernelTunables=yes \
         ProtectKernelModules=yes ProtectKernelLogs=yes SystemCallFilter=@system-service \
         StateDirectory=sluice Restart=on-failure EnvironmentFile=-/etc/sluice/env; do
  grep -qxF "$s" "$unit" || problems+=("$s missing")
done
if ((${#problems[@]} == 0)); then
  pass "systemd: reload, stop (TimeoutStopSec $stop > drain_timeout_ms $drain_ms), limits and hardening as documented"
else
  fail "systemd: $(IFS=';'; echo "${problems[*]}")"
fi
# Its sluice command lines, with this build and the example configuration, as --check-config.
for key in ExecStartPre ExecStart; do
  line=$(val "$key")
  read -r -a argv <<<"${line//\/etc\/sluice\/sluice.json/$root/conf/sluice.json}"
  argv[0]=$sluice
  argv=("${argv[@]/#--config/--check-config}")
  expect "systemd: $key's flags are sluice's ($line)" "${argv[@]}" --listen 127.0.0.1:0
done
if ! command -v systemd-analyze >/dev/null 2>&1; then
  skip "systemd: systemd-analyze not installed (Debian's systemd package): verify and security not run"
else
  # The unit as installed, but with this build's binary where /usr/local/bin/sluice will be, so
  # that verify finds an executable.
  mkdir -p "$tmp/systemd"
  sed "s#/usr/local/bin/sluice#$sluice#g" "$unit" >"$tmp/systemd/sluice.service"
  # verify exits 0 on an unknown key or a value it cannot parse (it ignores the line with a
  # warning): any output fails the check.
  what="systemd: $(systemd-analyze --version | head -1) verify, without a warning"
  if out=$(systemd-analyze verify "$tmp/systemd/sluice.service" 2>&1) && [ -z "$out" ]; then
    pass "$what"
  else
    fail "$what"
    printf '%s\n' "$out" | sed 's/^/    /'
  fi
  # 2.0 on systemd's 0-10 exposure scale (--threshold counts tenths): this unit is 1.8 on
  # systemd 252; dropping any of the sandboxing above raises it past the threshold.
  expect "systemd: security --offline exposure at most 2.0" \
    systemd-analyze security --offline=yes --threshold=20 --no-pager "$tmp/systemd/sluice.service"
fi
if ! command -v systemd-sysusers >/dev/null 2>&1; then
  skip "systemd: systemd-sysusers not installed: deploy/systemd/sluice.sysusers not checked"
else
  mkdir -p "$tmp/sysroot/etc"
  expect "systemd: sluice.sysusers creates the sluice user" \
    bash -c 'systemd-sysusers --root="$1" "$2" && grep -q "^sluice:x:[0-9]*:[0-9]*:.*:/var/lib/sluice:" "$1/etc/passwd"' \
    _ "$tmp/sysroot" "$root/deploy/systemd/sluice.sysusers"
fi

echo "deploy: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
