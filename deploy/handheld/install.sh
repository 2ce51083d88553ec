#!/usr/bin/env bash
# Install the coinf handheld on a laptop as a per-user service (no root):
#   ./install.sh --wheel coinf-0.2.0-py3-none-any.whl --bundle DIR   install or update
#   ./install.sh --uninstall                                          remove service and venv
#   ./install.sh --dry-run ...                                        print, change nothing
# Linux: a systemd user unit (systemctl --user); macOS: a launchd agent. The venv lives in
# ~/.local/share/coinf/venv, the bundle in ~/.local/share/coinf/bundle (the same bundle as on
# the wearable). Pair first: coinf handheld pair (see docs/DEPLOY.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}/coinf
wheel=""
bundle=""
dry_run=0
uninstall=0
system=$(uname -s)

while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel=${2:?--wheel needs a file}; shift 2 ;;
        --bundle) bundle=${2:?--bundle needs a directory}; shift 2 ;;
        --system) system=${2:?--system needs Linux or Darwin}; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

run() {
    printf '+ %s\n' "$*"
    if [ "$dry_run" = 0 ]; then "$@"; fi
}

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
