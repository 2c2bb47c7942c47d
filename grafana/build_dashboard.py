"""Writes grafana/dashboards/netmon.json, the netmon dashboard, from the package grafana/dashboard.

    python grafana/build_dashboard.py           # rewrite the JSON
    python grafana/build_dashboard.py --check   # exit 1 if the checked-in JSON is out of date

The panels are in grafana/dashboard, one module per row (builders.py has what the rows share,
document.py their order). The dashboard takes its Prometheus data source from the `datasource`
variable, never a fixed UID, so it imports and provisions into any Grafana. Every query is
evaluated against a real Prometheus by tests/test_dashboard_queries.py; tests/test_dashboard.py
checks the filters, the cell colours and that the JSON is this script's output;
docs/DASHBOARD.md walks through the panels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The package beside this file, whatever the working directory: tests load this file by path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard.document import render

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "netmon.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT} is out of date: run python grafana/build_dashboard.py", file=sys.stderr
            )
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
