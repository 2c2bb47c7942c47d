"""busbw against size, one line per op, path and chunking: paths are compared by looking."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from netmon.bandwidth import format_size
from netmon.errors import UsageError
from netmon.probe.spec import ProbeOutcome

# What --plot needs, said so that it works from a checkout as from an install: netmon-gpu is
# not on PyPI, so `pip install 'netmon-gpu[plot]'` would find nothing.
MISSING = (
    "--plot: needs matplotlib, which is not installed here: `pip install matplotlib` in netmon's "
    "environment (in a checkout: .venv/bin/pip install matplotlib), or install netmon with its "
    "plot extra (pip install '/path/to/netmon[plot]')"
)


def require() -> None:
    """Fail before any measuring when the plot could not be drawn after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(MISSING) from None


def busbw_against_size(outcomes: Sequence[ProbeOutcome], target: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: render straight to the file
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(MISSING) from None
    figure, axes = plt.subplots(figsize=(8, 5))
    for outcome in outcomes:
        if not outcome.results:
            continue
        spec = outcome.spec
        label = f"{spec.op} {spec.path}" + (f" x{spec.chunks} chunks" if spec.chunks > 1 else "")
        if spec.backend == "gloo" and spec.path != "default":
            label += " (gloo: the default path again)"
        sizes = [r.size_bytes for r in outcome.results]
        axes.plot(
            sizes,
            [r.busbw_bytes_per_second / 1e9 for r in outcome.results],
            marker="o",
            label=label,
        )
    axes.set_xscale("log", base=2)
    ticks = sorted({r.size_bytes for o in outcomes for r in o.results})
    axes.set_xticks(ticks, [format_size(t) for t in ticks], rotation=45)
    axes.set_xlabel("size (bytes)")
    axes.set_ylabel("busbw (GB/s)")
    first = next((o for o in outcomes if o.environment), None)
    where = f"{first.spec.backend}, {first.spec.ranks} ranks" if first else ""
    axes.set_title(f"netmon probe: busbw against size ({where})")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    try:
        figure.savefig(target, dpi=100)
    except OSError as exc:
        raise UsageError(f"--plot: {target}: {exc.strerror}") from None
    finally:
        plt.close(figure)
