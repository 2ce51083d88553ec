"""Where coinf keeps its per-user configuration (the policy file and the device profiles).

``$COINF_CONFIG`` names the policy file; otherwise it is ``$XDG_CONFIG_HOME/coinf/policy.json``
(``~/.config/coinf/policy.json``). Saved device profiles live next to it. Both the device layer
(profiles) and the wearable (policies) read it from here, so neither imports the other for it.
"""

from __future__ import annotations

import os
from pathlib import Path


def config_path() -> Path:
    """The policy file: ``$COINF_CONFIG``, else ``<XDG config dir>/coinf/policy.json``."""
    env = os.environ.get("COINF_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "coinf" / "policy.json"
