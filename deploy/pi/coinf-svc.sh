#!/usr/bin/env bash
# Run a coinf command as the wearable service does (installed as @PREFIX@/bin/coinf-svc by
# provision.sh): as the service user, with only the capabilities the HCI user channel needs,
# and with the service's configuration (bond store, TLS store, policy, profiles under @STATE@).
#   sudo coinf-svc wearable pair [--window-s 120]     bond a handheld
#   sudo coinf-svc wifi pair --connect tcp:IP:7879    pair a Wi-Fi helper (the service's key)
#   sudo coinf-svc doctor                             check the controller, runtime, memory...
#   sudo coinf-svc profile --bundle @STATE@/bundle    profile this Pi for the service's planner
#   sudo coinf-svc run @STATE@/bundle --transport ble --hci hci-socket:0 ...
# The controller serves one program at a time: for commands that open it (wearable, doctor,
# run) the service is stopped first and started again afterwards.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "coinf-svc: run with sudo" >&2; exit 2; }
[ $# -gt 0 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
hci="hci-socket:0"
if [ -r /etc/default/coinf-wearable ]; then
    # shellcheck disable=SC1091
    . /etc/default/coinf-wearable
    hci=${COINF_HCI:-$hci}
fi
was_active=0
case "$1" in
    wearable|doctor|run)
        if systemctl is-active --quiet coinf-wearable.service; then
            was_active=1
            systemctl stop coinf-wearable.service
        fi ;;
esac
restore() { if [ "$was_active" = 1 ]; then systemctl start coinf-wearable.service; fi; }
trap restore EXIT
args=("$@")
if [ "$1" = wearable ] && [ "${2:-}" = pair ] && [[ " $* " != *" --hci "* ]]; then
    args+=(--hci "$hci")
fi
setpriv --reuid=@USER@ --regid=@USER@ --init-groups \
    --inh-caps=+net_admin,+net_raw --ambient-caps=+net_admin,+net_raw \
    env HOME=@STATE@ COINF_CONFIG=@STATE@/policy.json COINF_CONTROL=/run/coinf/control.sock \
    COINF_TLS_DIR=@STATE@/tls \
    @PREFIX@/venv/bin/coinf "${args[@]}"
