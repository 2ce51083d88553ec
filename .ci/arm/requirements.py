"""Print the requirements of ``coinf[wearable]`` (the core + the wearable extra) from setup.cfg,
one per line: what the aarch64 guest of ``make test-arm`` installs."""

import configparser
import sys
from pathlib import Path


def wearable_requirements(setup_cfg: Path) -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    lines = cfg["options"]["install_requires"] + "\n" + cfg["options.extras_require"]["wearable"]
    return [x.strip() for x in lines.splitlines() if x.strip() and not x.strip().startswith("#")]


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.stdout.write("".join(r + "\n" for r in wearable_requirements(root / "setup.cfg")))
