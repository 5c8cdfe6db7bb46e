"""CLI of the engine harness.

Examples:
    python -m tools.engine list
    python -m tools.engine run prefix --out /tmp/engine-out
    python -m tools.engine run burst steady_ab --out /tmp/engine-out
    python -m tools.engine model --template think
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .cli import chosen, list_run_parser
from .model import ModelSpec, ensure_model
from .scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    ap, sub = list_run_parser("python -m tools.engine", __doc__, list(SCENARIOS), "scenario",
                              "list the scenarios and what servlens should find in each",
                              "drive a real llama.cpp server through scenarios; logs go to OUT/<run>/")
    model = sub.add_parser("model", help="generate (or find) the tiny model and print its path")
    model.add_argument("--template", choices=["chatml", "think"], default="chatml")
    model.add_argument("--seed", type=int, default=1234)
    model.add_argument("--model-cache", type=Path, default=None)
    args = ap.parse_args(argv)

    if args.cmd == "list":
        for s in SCENARIOS.values():
            print(f"{s.name}: runs {', '.join(r.run for r in s.runs)}\n  {s.description}\n  expect: {s.expect}")
        return 0
    if args.cmd == "model":
        print(ensure_model(ModelSpec(seed=args.seed, template=args.template), args.model_cache))
        return 0
    names = chosen(args.names, list(SCENARIOS), "scenario")
    if names is None:
        return 2
    from .scenarios import run_scenario

    t0 = time.time()
    for name in names:
        run_scenario(name, args.out, args.model_cache, args.seed)
    print(f"done in {time.time() - t0:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
