"""The busbw a healthy series is expected to reach at least before it has learned its own: a
site's `expect:` entries over the shipped table of published figures (expected_levels.json;
docs/SIGNAL.md, "Expected levels"). Pure: the only I/O is reading that table from the package.

An entry holds for a node when its `gpu_model` is part of the node's GPU model as NVML names it
(case-insensitive substring: "H100 80GB HBM3" matches "NVIDIA H100 80GB HBM3" and not "NVIDIA
H100 PCIe"), its `gpus` is the series' rank count on that node, and its op and path are the
series'; it says "at `size_bytes_min` and above, at least `busbw`". Among the entries that hold,
the most specific model wins, then the largest `size_bytes_min` not above the series' size. A
site's entries replace the table's for every shape (model, gpus, op, path) they name.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, field_validator

from netmon.bandwidth import MAX_PROBE_SIZE, OpName, bounded_size, parse_rate
from netmon.baseline.book import BaselineKey as Key
from netmon.schema import RATE_TEXT, SIZE_TEXT, also

TABLE = "expected_levels.json"
# Under this, busbw is latency-bound and varies with the host (docs/SIGNAL.md): the shipped table
# states no figure there.
TABLE_MIN_SIZE = 64 << 20


class ExpectEntry(BaseModel):
    """One expected level: at least `busbw` (bytes/s) for a series of this shape at
    `size_bytes_min` and above."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_model: str = Field(min_length=1, description="part of the GPU model NVML names")
    gpus: int = Field(ge=1, le=64, description="ranks on one node")
    op: OpName = "all_reduce"
    path: str = "default"
    size_bytes_min: int = Field(gt=0, le=MAX_PROBE_SIZE, json_schema_extra=also(SIZE_TEXT))
    busbw: float = Field(
        gt=0,
        allow_inf_nan=False,
        description="bytes/s, the healthy floor; decimal suffixes: 250G",
        json_schema_extra=also(RATE_TEXT),
    )
    note: str | None = None

    @field_validator("gpu_model")
    @classmethod
    def _model_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("give part of the GPU model, like H100 80GB HBM3")
        return value.strip()

    @field_validator("gpus", "size_bytes_min", mode="before")
    @classmethod
    def _no_bool(cls, value: object) -> object:
        # YAML's `yes` is True, and pydantic would read it as 1.
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a count; give a whole number")
        return value

    @field_validator("size_bytes_min", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if isinstance(value, (str, int)):
            return bounded_size(value, MAX_PROBE_SIZE, "a probe moves")
        return value

    @field_validator("busbw", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return parse_rate(value) if isinstance(value, (str, int, float)) else value

    def shape_matches(self, gpu_model: str, key: Key) -> bool:
        """Whether this entry speaks of series of `key`'s shape on a node of `gpu_model`."""
        _probe, op, _size, path, ranks = key
        return (
            self.op == op
            and self.path == path
            and self.gpus == ranks
            and self.gpu_model.casefold() in gpu_model.casefold()
        )


class PublishedLevel(ExpectEntry):
    """A row of the shipped table: a floor taken from a published figure, and where."""

    source: str = Field(pattern=r"^https://")  # a public URL
    # The published busbw the floor was taken from (bytes/s): at size_bytes_min, or the lowest
    # published at or above it.
    published_busbw: float = Field(gt=0, allow_inf_nan=False)


@functools.cache
def shipped_table() -> tuple[PublishedLevel, ...]:
    """The packaged table of published figures, read once. A row under TABLE_MIN_SIZE (or
    without a public source: pydantic) is a packaging defect: ValueError."""
    text = resources.files("netmon.baseline").joinpath(TABLE).read_text(encoding="utf-8")
    rows = tuple(PublishedLevel.model_validate(row) for row in json.loads(text)["levels"])
    for row in rows:
        if row.size_bytes_min < TABLE_MIN_SIZE:
            raise ValueError(f"{TABLE}: {row.gpu_model} x{row.gpus} is latency-bound")
    return rows


def lookup(entries: Iterable[ExpectEntry], gpu_model: str, key: Key) -> float | None:
    """The level `entries` expect of `key` on a node of `gpu_model`, or None."""
    size = key[2]
    held = [e for e in entries if e.shape_matches(gpu_model, key) and e.size_bytes_min <= size]
    if not held:
        return None
    return max(held, key=lambda e: (len(e.gpu_model), e.size_bytes_min)).busbw


def expected(
    gpu_model: str, table: Sequence[ExpectEntry], site: Sequence[ExpectEntry], key: Key
) -> float | None:
    """The site's level where the site names the shape at all (even with no size that holds),
    else the table's."""
    if any(e.shape_matches(gpu_model, key) for e in site):
        return lookup(site, gpu_model, key)
    return lookup(table, gpu_model, key)


def _nothing(_key: Key) -> float | None:
    return None


def expectation_for(
    gpu_model: str | None,
    table: Sequence[ExpectEntry] | None = None,
    site_entries: Sequence[ExpectEntry] = (),
) -> Callable[[Key], float | None]:
    """What BaselineBook(expect=...) takes for a node of `gpu_model` (None: CPU ranks, or a
    model NVML could not name: nothing is expected). `table`: the shipped one by default."""
    if not gpu_model:
        return _nothing
    rows = tuple(shipped_table() if table is None else table)
    site = tuple(site_entries)

    def expect(key: Key) -> float | None:
        return expected(gpu_model, rows, site, key)

    return expect
