#!/usr/bin/env bash
# Make sure the Redis and PostgreSQL the integration tests use are answering; start them if not.
# Under CI=true, also install Debian's chromium (the report test opens its page in it) and docker-compose
# (the compose test validates docker-compose.yml with it; no Docker daemon needed) and pgbouncer (the
# tests that run detq behind it start their own; the package's own service is not started here) and
# faketime (a worker started with its clock a minute off).
set -uo pipefail

if [ "${CI:-}" = "true" ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    echo "installing chromium for the report test"
    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) || echo "chromium: install failed" >&2
fi
if [ "${CI:-}" = "true" ] && ! command -v docker-compose >/dev/null && command -v apt-get >/dev/null; then
    echo "installing docker-compose for the compose test"
    (apt-get install -y -q docker-compose >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q docker-compose >/dev/null 2>&1)) || echo "docker-compose: install failed" >&2
fi

if [ "${CI:-}" = "true" ] && ! command -v faketime >/dev/null && command -v apt-get >/dev/null; then
    echo "installing faketime for the clock test"
    (apt-get install -y -q faketime >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q faketime >/dev/null 2>&1)) || echo "faketime: install failed" >&2
fi
if [ "${CI:-}" = "true" ] && ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ] && command -v apt-get >/dev/null; then
    echo "installing pgbouncer for the pooler test"
    (apt-get install -y -q pgbouncer >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q pgbouncer >/dev/null 2>&1)) || echo "pgbouncer: install failed" >&2
fi

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

if ! redis_up && command -v redis-server >/dev/null; then
    echo "starting redis-server"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
fi
if ! pg_up && command -v pg_ctlcluster >/dev/null; then
    echo "starting postgresql"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
for _ in $(seq 1 30); do
    if redis_up && pg_up; then
        echo "services: redis and postgresql are up"
        exit 0
    fi
    sleep 1
done
echo "services: redis up: $(redis_up && echo yes || echo no); postgresql up: $(pg_up && echo yes || echo no)" >&2
# Not fatal here: the test fixtures skip locally, and fail under CI=true with the reason.
exit 0
