#!/usr/bin/env bash
# Install the coinf handheld on a laptop as a per-user service (no root):
#   ./install.sh --wheel coinf-0.2.0-py3-none-any.whl --bundle DIR   install or update
#   ./install.sh --uninstall                                          remove service and venv
#   ./install.sh --dry-run ...                                        print, change nothing
#   sudo ./install.sh --dedicated-user coinf-handheld --wheel W --bundle DIR   (Linux)
# Linux: a systemd user unit (systemctl --user); macOS: a launchd agent. The venv lives in
# ~/.local/share/coinf/venv, the bundle in ~/.local/share/coinf/bundle (the same bundle as on
# the wearable). Pair first: coinf handheld pair (see docs/DEPLOY.md).
# --dedicated-user (Linux, root): a system unit running as that system user instead, its keys and
# bundle in /var/lib/NAME (0700), the venv in /opt/NAME: no login user's process can read its
# identity.pem (docs/SECURITY.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}/coinf
wheel=""
bundle=""
dry_run=0
uninstall=0
system=$(uname -s)
dedicated=""

while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel=${2:?--wheel needs a file}; shift 2 ;;
        --bundle) bundle=${2:?--bundle needs a directory}; shift 2 ;;
        --system) system=${2:?--system needs Linux or Darwin}; shift 2 ;;
        --dedicated-user) dedicated=${2:?--dedicated-user needs a user name}; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

run() {
    printf '+ %s\n' "$*"
    if [ "$dry_run" = 0 ]; then "$@"; fi
}

# --dedicated-user NAME: a system unit as that user; keys and bundle in /var/lib/NAME (0700)
install_dedicated() {
    local user=$dedicated state=/var/lib/$dedicated prefix=/opt/$dedicated
    local unit=/etc/systemd/system/coinf-handheld.service
    [ "$system" = Linux ] || { echo "install.sh: --dedicated-user is for Linux (systemd)" >&2; exit 2; }
    if [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then
        echo "install.sh: --dedicated-user needs root (sudo), or add --dry-run" >&2; exit 2
    fi
    if [ "$uninstall" = 1 ]; then
        run systemctl disable --now coinf-handheld.service || true
        run rm -f "$unit"
        run rm -rf "$prefix"
        echo "install.sh: kept $state (keys, bundle) and the user $user; remove them by hand" >&2
        return
    fi
    [ -n "$wheel" ] || { echo "install.sh: --wheel FILE is required (make wheel)" >&2; exit 2; }
    if [ "$dry_run" = 0 ] && [ ! -f "$wheel" ]; then echo "install.sh: no $wheel" >&2; exit 2; fi
    if id -u "$user" >/dev/null 2>&1; then
        echo "install.sh: user $user exists" >&2
    else
        run useradd --system --home-dir "$state" --shell /usr/sbin/nologin --user-group "$user"
    fi
    if getent group bluetooth >/dev/null 2>&1; then run usermod -aG bluetooth "$user"; fi
    run install -d -m 0700 -o "$user" -g "$user" "$state"
    run install -d -m 0700 -o "$user" -g "$user" "$state/tls"
    run install -d -m 0755 "$prefix"
    if [ ! -x "$prefix/venv/bin/python" ]; then run python3 -m venv "$prefix/venv"; fi
    run "$prefix/venv/bin/python" -m pip install --quiet --upgrade "${wheel}[handheld]"
    if [ -n "$bundle" ]; then
        run rm -rf "$state/bundle"
        run cp -R "$bundle" "$state/bundle"
        run chown -R "$user:$user" "$state/bundle"
    fi
    printf '+ write %s\n' "$unit"
    if [ "$dry_run" = 0 ]; then
        sed -e "s|@USER@|$user|g" -e "s|@STATE@|$state|g" -e "s|@PREFIX@|$prefix|g" \
            "$here/coinf-handheld-system.service" >"$unit"
    fi
    run systemctl daemon-reload
    run systemctl enable --now coinf-handheld.service
    echo "install.sh: logs: journalctl -u coinf-handheld -f; Wi-Fi pairing as the service:" >&2
    echo "  sudo -u $user env HOME=$state COINF_TLS_DIR=$state/tls $prefix/venv/bin/coinf wifi pair --listen" >&2
}

if [ -n "$dedicated" ]; then
    install_dedicated
    exit 0
fi

case "$system" in
    Linux) target=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user/coinf-handheld.service ;;
    Darwin) target=$HOME/Library/LaunchAgents/org.coinf.handheld.plist ;;
    *) echo "install.sh: $system is not supported (Linux or macOS)" >&2; exit 2 ;;
esac

if [ "$uninstall" = 1 ]; then
    if [ "$system" = Linux ]; then
        run systemctl --user disable --now coinf-handheld.service || true
    else
        run launchctl bootout "gui/$(id -u)" "$target" || true
    fi
    run rm -f "$target"
    run rm -rf "$data/venv"
    echo "install.sh: kept $data/bundle; remove it by hand if you like" >&2
    exit 0
fi

[ -n "$wheel" ] || { echo "install.sh: --wheel FILE is required (make wheel)" >&2; exit 2; }
if [ "$dry_run" = 0 ] && [ ! -f "$wheel" ]; then echo "install.sh: no $wheel" >&2; exit 2; fi

if [ -x "$data/venv/bin/python" ]; then
    echo "install.sh: venv $data/venv exists" >&2
else
    run mkdir -p "$data"
    run python3 -m venv "$data/venv"
fi
run "$data/venv/bin/python" -m pip install --quiet --upgrade "${wheel}[handheld]"
if [ -n "$bundle" ]; then
    run rm -rf "$data/bundle"
    run cp -R "$bundle" "$data/bundle"
fi
run mkdir -p "$(dirname "$target")"
if [ "$system" = Linux ]; then
    run cp "$here/coinf-handheld.service" "$target"
    run systemctl --user daemon-reload
    run systemctl --user enable --now coinf-handheld.service
    echo "install.sh: logs: journalctl --user -u coinf-handheld -f" >&2
else
    printf '+ write %s\n' "$target"
    if [ "$dry_run" = 0 ]; then
        sed "s|@HOME@|$HOME|g" "$here/org.coinf.handheld.plist" >"$target"
        launchctl bootout "gui/$(id -u)" "$target" 2>/dev/null || true
    fi
    run launchctl bootstrap "gui/$(id -u)" "$target"
    echo "install.sh: logs: ~/Library/Logs/coinf-handheld.log" >&2
fi
