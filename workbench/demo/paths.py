"""Where the demo checkpoints live (``assets/`` at the repository root)."""
from __future__ import annotations

import os
from pathlib import Path

#: the repository's assets/ directory; ``WORKBENCH_ASSETS`` overrides it
ASSETS = Path(os.environ.get("WORKBENCH_ASSETS") or Path(__file__).resolve().parents[2] / "assets")
DEMO = ASSETS / "demo"
DEMO_4BIT = ASSETS / "demo-4bit"
DEMO_MOE = ASSETS / "demo-moe"
