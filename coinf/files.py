"""Writing a file whole or not at all, and keeping a directory private (the bottom layer:
imports nothing of coinf)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

#: a private directory's mode: its owner only
PRIVATE_DIR_MODE = 0o700


def private_directory(directory: Path, what: str, hint: str,
                      error: type[Exception]) -> Path:
    """Create ``directory`` 0700 if it is missing, else check it: a directory, closed to group
    and others, owned by this user (we never chmod one we did not create: it may be shared).
    Anything else raises ``error`` naming ``what`` (``"the TLS store"``) and, for one open to
    others, the ``hint`` of how to fix it."""
    if not directory.exists():
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
            os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask
        except OSError as exc:
            raise error(f"cannot create {what} {directory}: {exc.strerror}") from None
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {directory} is not a directory")
    if st.st_mode & 0o077:
        raise error(f"{what} {directory} is accessible to other users (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}); {hint}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise error(f"{what} {directory} belongs to another user")
    return directory


def write_atomically(path: str | os.PathLike[str], data: bytes, mode: int | None = None
                     ) -> None:
    """Write ``data`` to ``path`` through a temporary sibling renamed over it, creating the
    folder if missing. A crash or a full disk leaves the old file (or none), never part of the
    new one, and no temporary file behind. The file gets ``mode`` exactly (e.g. 0o600 for keys;
    it never exists with more), else the permissions a plain write gives."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # the umask only takes bits away; this is exact
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def privacy_problems(path: Path) -> list[str]:
    """What keeps ``path`` (a key file) and its directory from being this user's alone: a
    file or directory of another user, group/others bits, not a regular file. Empty when
    private or missing. Reports only (``coinf doctor``); the stores tighten or refuse."""
    problems = []
    for item, kind in ((path.parent, "directory"), (path, "file")):
        try:
            st = os.lstat(item)
        except FileNotFoundError:
            continue
        if kind == "file" and not stat.S_ISREG(st.st_mode):
            problems.append(f"{item} is not a regular file")
            continue
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            problems.append(f"{item} belongs to uid {st.st_uid}, not this user")
        if st.st_mode & 0o077:
            problems.append(f"{item} is mode {stat.S_IMODE(st.st_mode):04o} (open to other "
                            f"users; want {'0700' if kind == 'directory' else '0600'})")
    return problems
