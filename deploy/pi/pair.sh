#!/usr/bin/env bash
# Pair a handheld with this wearable (installed as @PREFIX@/bin/coinf-pair by provision.sh).
#   sudo coinf-pair [--window-s 120]
# The controller serves one program at a time: the service is stopped while the pairing window
# is open, and started again afterwards. The bond is written as the service user, with only the
# capability the HCI user channel needs, into the bond store the service reads.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "coinf-pair: run with sudo" >&2; exit 2; }
hci="hci-socket:0"
if [ -r /etc/default/coinf-wearable ]; then
    # shellcheck disable=SC1091
    . /etc/default/coinf-wearable
    hci=${COINF_HCI:-$hci}
fi
was_active=0
if systemctl is-active --quiet coinf-wearable.service; then
    was_active=1
    systemctl stop coinf-wearable.service
fi
restore() { if [ "$was_active" = 1 ]; then systemctl start coinf-wearable.service; fi; }
trap restore EXIT
setpriv --reuid=@USER@ --regid=@USER@ --init-groups \
    --inh-caps=+net_admin,+net_raw --ambient-caps=+net_admin,+net_raw \
    env COINF_CONFIG=@STATE@/policy.json \
    @PREFIX@/venv/bin/coinf wearable pair --hci "$hci" "$@"
