"""Progress on stderr for long commands: a tqdm bar per stage on a terminal, plain
``stage: done/total`` lines otherwise (logs, CI)."""

from __future__ import annotations

import sys
from typing import Any


class Bar:
    """tqdm on a terminal, plain progress lines otherwise (stderr)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.bars: dict[str, Any] = {}
        self.last: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:
                self.tty = False
            else:
                bar = self.bars.get(stage)
                if bar is None:
                    bar = self.bars[stage] = tqdm(total=total, desc=stage, file=sys.stderr,
                                                  leave=False)
                bar.n = done
                bar.refresh()
                if done >= total:
                    bar.close()
                return
        step = max(total // 10, 1)
        if done == total or done - self.last.get(stage, -step) >= step:
            self.last[stage] = done
            print(f"{stage}: {done}/{total}", file=sys.stderr, flush=True)
