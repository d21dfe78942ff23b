#!/usr/bin/env bash
# The PostgreSQL server binaries the store's tests start a throwaway server from (sdcguard.testing.postgres):
# Debian's `postgresql` package (initdb and pg_ctl under /usr/lib/postgresql/<ver>/bin). Installed here when missing
# and this is root on a Debian-like system (CI is); otherwise it says what to install and the tests that need a
# server skip, saying why (in CI, with $CI set, they fail instead).
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || [ -n "${SDCGUARD_PG_BIN:-}" ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing the PostgreSQL server (apt-get install postgresql) for the store's tests" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    exit 0
fi
echo "==> no PostgreSQL server binaries: install the postgresql package (or set SDCGUARD_PG_BIN) to run the" \
    "store's PostgreSQL tests; they skip without it" >&2
