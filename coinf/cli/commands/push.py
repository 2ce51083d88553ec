"""``coinf push BUNDLE HOST``: copy a bundle to the wearable, verify it, and reload the service.

1. copy ``BUNDLE/`` to ``HOST:DEST.incoming/`` (rsync over ssh when rsync is here, else tar
   through ssh);
2. verify: the Pi lists ``sha256sum`` of every file it received; every file must match the local
   bundle's (a mismatch stops here: the serving bundle is untouched);
3. swap: ``DEST`` -> ``DEST.old``, ``DEST.incoming`` -> ``DEST``;
4. reload: ``coinf wearable reload --expect IDENTITY`` on the Pi asks the running service over its
   control socket (:mod:`coinf.wearable.control`) to load the new bundle; its JSON answer must
   name the pushed identity.

``--ssh`` is the ssh command (default ``ssh``; e.g. ``"ssh -p 2222"``). ``--dry-run`` prints the
commands and runs none. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from coinf.errors import CoinfError, UserError

DEFAULT_DEST = "/var/lib/coinf/bundle"
DEFAULT_REMOTE_COINF = "/opt/coinf/venv/bin/coinf"
DEFAULT_CONTROL = "/run/coinf/control.sock"
STEP_TIMEOUT_S = 600.0
MAX_DEPTH = 32  # folders below the bundle's top


class PushError(CoinfError):
    """The copy, the verification or the reload on the wearable failed."""


def bundle_files(root: Path) -> list[Path]:
    """Every file under ``root``, sorted, following the symbolic links that stay inside it (the
    copy dereferences them, so the wearable gets the files, not the links).

    A symbolic link to a file or a folder that resolves outside the bundle, or to nothing, or
    into a loop, is refused with :class:`~coinf.errors.UserError` naming the link: the push would
    otherwise send whatever it names on this machine."""
    top = root.resolve()
    files: list[Path] = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        here = Path(folder)
        if len(here.relative_to(root).parts) > MAX_DEPTH:
            raise UserError(f"{here}: nested over {MAX_DEPTH} folders deep (a symbolic link "
                            f"loop?); coinf push refuses it")
        for name in (*dirs, *names):
            path = here / name
            if not path.is_symlink():
                continue
            target = path.resolve()
            if not target.is_relative_to(top):
                raise UserError(f"{path}: a symbolic link to {target}, outside the bundle "
                                f"{root}; coinf push refuses it (copy the file into the bundle)")
            if not target.exists():
                raise UserError(f"{path}: a symbolic link to {target}, which does not exist")
            if target.is_dir() and here.resolve().is_relative_to(target):
                raise UserError(f"{path}: a symbolic link to {target}, a folder that holds it "
                                f"(a loop); coinf push refuses it")
        files.extend(here / n for n in names if (here / n).is_file())
    return sorted(files)


def local_digests(root: Path, files: list[Path] | None = None) -> dict[str, str]:
    """``{"./c001/head.onnx": sha256 hex, ...}`` for every file under ``root`` (the names the
    remote ``find . -type f`` prints)."""
    out = {}
    for path in bundle_files(root) if files is None else files:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out["./" + path.relative_to(root).as_posix()] = h.hexdigest()
    return out


def tree_digest(digests: dict[str, str]) -> str:
    """One hash for the whole bundle: sha256 of the sorted ``hex  path`` lines."""
    text = "".join(f"{digests[k]}  {k}\n" for k in sorted(digests))
    return hashlib.sha256(text.encode()).hexdigest()


def parse_sha256sum(text: str) -> dict[str, str]:
    """``sha256sum`` output -> ``{path: hex}``; lines that are not ``HEX  PATH`` are an error."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise PushError(f"the wearable's sha256sum printed {line[:120]!r}; expected "
                            f"'HEX  PATH' lines")
        out[name] = digest
    return out


def compare(local: dict[str, str], remote: dict[str, str]) -> list[str]:
    """Human-readable differences (empty = identical)."""
    diffs = [f"{k}: missing on the wearable" for k in sorted(set(local) - set(remote))]
    diffs += [f"{k}: not in the bundle" for k in sorted(set(remote) - set(local))]
    diffs += [f"{k}: sha256 {remote[k][:12]}... != {local[k][:12]}..." for k in sorted(local)
              if k in remote and remote[k] != local[k]]
    return diffs


class Remote:
    """Runs commands on HOST through ssh (or prints them with ``dry_run``)."""

    def __init__(self, ssh: str, host: str, dry_run: bool) -> None:
        self.ssh = shlex.split(ssh)
        if not self.ssh:
            raise UserError("--ssh must name a command (default: ssh)")
        self.host = host
        self.dry_run = dry_run
        self.log: list[str] = []

    def run(self, command: str, *, stdin: Any = None, what: str) -> str:
        argv = [*self.ssh, self.host, command]
        self.log.append(shlex.join(argv))
        if self.dry_run:
            return ""
        print(f"coinf push: {what}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run(argv, stdin=stdin, capture_output=True, text=True,
                                  timeout=STEP_TIMEOUT_S, check=False)
        except FileNotFoundError:
            raise UserError(f"--ssh {self.ssh[0]!r}: no such command") from None
        except subprocess.TimeoutExpired:
            raise PushError(f"{what} on {self.host} took over {STEP_TIMEOUT_S:g} s") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise PushError(f"{what} on {self.host} failed: {last[:300]}")
        return proc.stdout


def copy(remote: Remote, src: Path, incoming: str, method: str) -> str:
    if method == "auto":
        method = "rsync" if shutil.which("rsync") else "tar"
    if method == "rsync":
        argv = ["rsync", "-a", "--copy-links", "--delete", "-e", shlex.join(remote.ssh), f"{src}/",
                f"{remote.host}:{incoming}/"]
        remote.log.append(shlex.join(argv))
        if not remote.dry_run:
            print("coinf push: copying (rsync)", file=sys.stderr, flush=True)
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                                  check=False)
            if proc.returncode != 0:
                raise PushError(f"rsync to {remote.host} failed: {proc.stderr.strip()[-300:]}")
        return method
    q = shlex.quote(incoming)
    command = f"rm -rf {q} && mkdir -p {q} && tar -C {q} -xf -"
    if remote.dry_run:
        remote.log.append(f"tar -C {shlex.quote(str(src))} -h -cf - . | "
                          + shlex.join([*remote.ssh, remote.host, command]))
        return method
    tar = subprocess.Popen(["tar", "-C", str(src), "-h", "-cf", "-", "."],
                           stdout=subprocess.PIPE)
    try:
        remote.run(command, stdin=tar.stdout, what="copying (tar)")
    finally:
        if tar.stdout:
            tar.stdout.close()
        tar.wait()
    remote.log[-1] = f"tar -C {shlex.quote(str(src))} -h -cf - . | {remote.log[-1]}"
    return method


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle

    src = Path(args.bundle)
    bundle = Bundle.load(src)  # a broken bundle fails here, before anything is sent
    if not args.host or args.host.startswith("-"):
        raise UserError(f"HOST {args.host!r}: expected an ssh destination such as pi@coinf-pi")
    dest = args.dest.rstrip("/")
    if not dest.startswith("/"):
        raise UserError(f"--dest {args.dest!r}: expected an absolute path on the wearable")
    incoming, old = f"{dest}.incoming", f"{dest}.old"
    files = bundle_files(src)  # a symbolic link out of the bundle is refused here, before ssh
    digests = local_digests(src, files)
    remote = Remote(args.ssh, args.host, args.dry_run)
    report: dict[str, Any] = {"host": args.host, "dest": dest, "identity": bundle.identity,
                              "sha256": tree_digest(digests), "files": len(digests),
                              "bytes": sum(p.stat().st_size for p in files)}
    report["copied_with"] = copy(remote, src, incoming, args.copy)
    listing = remote.run(f"cd {shlex.quote(incoming)} && find . -type f -print0 | LC_ALL=C "
                         f"sort -z | xargs -0 sha256sum", what="verifying the copy")
    if not args.dry_run:
        diffs = compare(digests, parse_sha256sum(listing))
        if diffs:
            raise PushError(f"the copy on {args.host} differs from {src} ({len(diffs)} files): "
                            + "; ".join(diffs[:5]) + f"; the serving bundle {dest} is unchanged")
        report["verified"] = True
    qd, qi, qo = (shlex.quote(x) for x in (dest, incoming, old))
    remote.run(f"rm -rf {qo} && if [ -e {qd} ]; then mv {qd} {qo}; fi && mv {qi} {qd}",
               what="swapping the bundle in")
    if args.no_reload:
        report["reload"] = None
    else:
        try:
            out = remote.run(shlex.join([args.remote_coinf, "wearable", "reload", "--control",
                                         args.control, "--expect", bundle.identity]),
                             what="reloading the service")
        except PushError as exc:
            raise PushError(f"{exc}. The verified bundle is in place at {dest}; start the "
                            f"service (sudo systemctl start coinf-wearable) to serve it") from None
        if not args.dry_run:
            try:
                report["reload"] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise PushError(f"the service's reload answer is not JSON: {out[-200:]!r}") \
                    from None
    if args.dry_run:
        report["dry_run"] = remote.log
    print(json.dumps(report, indent=1))
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="split bundle directory (from `coinf split`)")
    parser.add_argument("host", help="the wearable, as ssh knows it (pi@coinf-pi.local)")
    parser.add_argument("--dest", default=DEFAULT_DEST,
                        help=f"bundle directory on the wearable (default {DEFAULT_DEST})")
    parser.add_argument("--ssh", default="ssh", help="ssh command (default: ssh)")
    parser.add_argument("--copy", choices=("auto", "rsync", "tar"), default="auto",
                        help="rsync (delta transfer) or tar through ssh (default: rsync if "
                             "installed)")
    parser.add_argument("--remote-coinf", default=DEFAULT_REMOTE_COINF,
                        help=f"coinf on the wearable (default {DEFAULT_REMOTE_COINF}, where "
                             f"deploy/pi/provision.sh installs it)")
    parser.add_argument("--control", default=DEFAULT_CONTROL,
                        help=f"the service's control socket there (default {DEFAULT_CONTROL})")
    parser.add_argument("--no-reload", action="store_true",
                        help="copy and verify only; do not tell the service")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.set_defaults(func=run)
