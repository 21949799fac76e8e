"""Where the demo checkpoints live (``assets/`` at the repository root)."""
from __future__ import annotations

import os
from pathlib import Path

#: the repository's assets/ directory; ``WORKBENCH_ASSETS`` overrides it
ASSETS = Path(os.environ.get("WORKBENCH_ASSETS") or Path(__file__).resolve().parents[2] / "assets")
DEMO = ASSETS / "demo"
DEMO_4BIT = ASSETS / "demo-4bit"
DEMO_MOE = ASSETS / "demo-moe"
DEMO_EXPERTS = ASSETS / "demo-experts"
DEMO_KV = ASSETS / "demo-kv"

#: the demo checkpoints by name (``workbench demo --model NAME``)
VARIANTS = {"demo": DEMO, "4bit": DEMO_4BIT, "moe": DEMO_MOE, "experts": DEMO_EXPERTS, "kv": DEMO_KV}
