#!/usr/bin/env bash
# Turn a fresh 64-bit Raspberry Pi OS (bookworm, Python 3.11) into a coinf wearable.
#
#   sudo ./provision.sh --wheel coinf-0.2.0-py3-none-any.whl [--bundle DIR] [--admin pi]
#     (the Pi's lean wheel: `make wheel-pi` on the laptop -> dist/pi/coinf-0.2.0-py3-none-any.whl)
#   sudo ./provision.sh --uninstall [--purge]
#   ./provision.sh --dry-run ...          print every change, make none (no root needed)
#
# What it does (each step is skipped when already done, so running it again is safe):
#   1. apt: python3-venv (Raspberry Pi OS refuses system-wide pip: PEP 668);
#   2. a system user `coinf` (no login) and its state dir /var/lib/coinf (bundle, bonds,
#      policy), group-writable for the admin user so `coinf push` can deliver bundles; the key
#      stores in it (bonds/, tls/) are 0700 and the service user's alone;
#   3. a venv in /opt/coinf/venv with the wheel's `coinf[wearable]`;
#   4. the controller for coinf: bluetoothd disabled (bumble drives the controller through the
#      HCI user channel), the radio unblocked; the service gets CAP_NET_ADMIN instead of root;
#   5. the systemd unit coinf-wearable.service (+ /etc/default/coinf-wearable), enabled; it
#      starts once a bundle is in /var/lib/coinf/bundle; and /opt/coinf/bin/coinf-svc, which
#      runs a coinf command as the service would (pairing, doctor, profile, run).
# --uninstall removes the unit, the venv and re-enables bluetoothd; --purge also removes the
# state dir (bundle, bonds) and the user.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/coinf
state=/var/lib/coinf
user=coinf
unit=/etc/systemd/system/coinf-wearable.service
defaults=/etc/default/coinf-wearable
memory_max=400M
wheel=""
bundle=""
admin=${SUDO_USER:-}
dry_run=0
uninstall=0
purge=0

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel=${2:?--wheel needs a file}; shift 2 ;;
        --bundle) bundle=${2:?--bundle needs a directory}; shift 2 ;;
        --admin) admin=${2:?--admin needs a user name}; shift 2 ;;
        --user) user=${2:?--user needs a name}; shift 2 ;;
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --memory-max) memory_max=${2:?--memory-max needs a size such as 400M}; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --uninstall) uninstall=1; shift ;;
        --purge) purge=1; shift ;;
        -h|--help) usage 0 ;;
        *) echo "provision.sh: unknown option $1" >&2; usage 2 ;;
    esac
done

say() { printf '%s\n' "provision: $*" >&2; }
die() { printf '%s\n' "provision: error: $*" >&2; exit 2; }

# run CMD...: print it; run it unless --dry-run
run() {
    printf '+ %s\n' "$*"
    if [ "$dry_run" = 0 ]; then "$@"; fi
}

# put FILE MODE < content: install content as FILE unless it already has exactly that content
put() {
    local file=$1 mode=$2 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [ -f "$file" ] && cmp -s "$tmp" "$file"; then
        say "$file is up to date"
        rm -f "$tmp"
        return 1
    fi
    printf '+ write %s (mode %s)\n' "$file" "$mode"
    if [ "$dry_run" = 0 ]; then
        install -m "$mode" "$tmp" "$file"
    else
        sed 's/^/    | /' "$tmp"
    fi
    rm -f "$tmp"
    return 0
}

have_unit() { systemctl list-unit-files "$1" >/dev/null 2>&1 && systemctl cat "$1" >/dev/null 2>&1; }

if [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then
    die "run as root (sudo $0 ...), or add --dry-run to see what it would do"
fi

if [ "$uninstall" = 1 ]; then
    if have_unit coinf-wearable.service; then
        run systemctl disable --now coinf-wearable.service
    fi
    [ -e "$unit" ] && run rm -f "$unit"
    [ -e "$defaults" ] && run rm -f "$defaults"
    run systemctl daemon-reload
    [ -d "$prefix" ] && run rm -rf "$prefix"
    if have_unit bluetooth.service; then
        run systemctl enable --now bluetooth.service
    fi
    if [ "$purge" = 1 ]; then
        [ -d "$state" ] && run rm -rf "$state"
        if id -u "$user" >/dev/null 2>&1; then run userdel "$user"; fi
    else
        say "kept $state (bundle, bonds); --purge removes it and the user $user"
    fi
    say "uninstalled"
    exit 0
fi

[ -n "$wheel" ] || die "--wheel FILE is required (build it with \`make wheel-pi\` on the laptop: dist/pi/*.whl)"
if [ "$dry_run" = 0 ] && [ ! -f "$wheel" ]; then die "--wheel $wheel: no such file"; fi
case "$wheel" in *.whl) ;; *) die "--wheel $wheel: expected a .whl file" ;; esac
if [ -n "$bundle" ] && [ "$dry_run" = 0 ] && [ ! -f "$bundle/manifest.json" ]; then
    die "--bundle $bundle: not a coinf bundle (no manifest.json)"
fi
if [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091
    . /etc/os-release
    [ "${VERSION_CODENAME:-}" = bookworm ] || say "warning: made for bookworm, this is ${PRETTY_NAME:-unknown}"
fi
[ "$(uname -m)" = aarch64 ] || say "warning: $(uname -m) is not aarch64 (64-bit Raspberry Pi OS)"

# 1. packages
missing=()
for pkg in python3-venv python3-pip rfkill; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    run apt-get update
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
else
    say "packages present"
fi

# 2. user and state directory
if id -u "$user" >/dev/null 2>&1; then
    say "user $user exists"
else
    run useradd --system --home-dir "$state" --shell /usr/sbin/nologin --user-group "$user"
fi
if [ -n "$admin" ] && [ "$admin" != root ] && [ "$admin" != "$user" ]; then
    if id -nG "$admin" 2>/dev/null | tr ' ' '\n' | grep -qx "$user"; then
        say "$admin is in group $user"
    else
        run usermod -aG "$user" "$admin"
    fi
fi
run install -d -m 2775 -o "$user" -g "$user" "$state"
run install -d -m 0700 -o "$user" -g "$user" "$state/bonds"
run install -d -m 0700 -o "$user" -g "$user" "$state/tls"  # identity.pem, peers.json

# 3. the venv and coinf[wearable]
if [ -x "$prefix/venv/bin/python" ]; then
    say "venv $prefix/venv exists"
else
    run install -d -m 0755 "$prefix"
    run python3 -m venv "$prefix/venv"
fi
run "$prefix/venv/bin/python" -m pip install --quiet --upgrade "${wheel}[wearable]"
[ -f "$here/../../docs/DEPLOY.md" ] && run install -m 0644 "$here/../../docs/DEPLOY.md" "$prefix/DEPLOY.md"
run install -d -m 0755 "$prefix/bin"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@STATE@|$state|g" -e "s|@USER@|$user|g" \
    "$here/coinf-svc.sh" | put "$prefix/bin/coinf-svc" 0755 || true

# 4. the controller: bumble, not bluetoothd
if have_unit bluetooth.service && systemctl is-enabled bluetooth.service >/dev/null 2>&1; then
    run systemctl disable --now bluetooth.service
else
    say "bluetoothd is not enabled"
fi
if command -v rfkill >/dev/null 2>&1 || [ "$dry_run" = 1 ]; then
    run rfkill unblock bluetooth
fi

# 5. the service
changed=0
sed -e "s|@PREFIX@|$prefix|g" -e "s|@STATE@|$state|g" -e "s|@USER@|$user|g" \
    -e "s|@MEMORY_MAX@|$memory_max|g" "$here/coinf-wearable.service" | put "$unit" 0644 && changed=1
if [ ! -f "$defaults" ]; then
    put "$defaults" 0644 <"$here/coinf-wearable.default" && changed=1
else
    say "$defaults kept (local settings)"
fi
if [ "$changed" = 1 ]; then run systemctl daemon-reload; fi
run systemctl enable coinf-wearable.service

if [ -n "$bundle" ]; then
    run rm -rf "$state/bundle.incoming"
    run cp -r "$bundle" "$state/bundle.incoming"
    run chown -R "$user:$user" "$state/bundle.incoming"
    run chmod -R g+rwX "$state/bundle.incoming"  # the admin (group) replaces it on coinf push
    run rm -rf "$state/bundle"
    run mv "$state/bundle.incoming" "$state/bundle"
fi
if [ -f "$state/bundle/manifest.json" ] || [ -n "$bundle" ]; then
    run systemctl restart coinf-wearable.service
else
    say "no bundle yet: \`coinf push BUNDLE $(hostname)\` from the laptop starts the service"
fi
say "done. Next: pair a handheld (sudo $prefix/bin/coinf-svc wearable pair), then"
say "check: sudo $prefix/bin/coinf-svc doctor; logs: journalctl -u coinf-wearable -f"
