"""Reading `nvidia-smi topo -m` (and `topo -p2p`) text into the topology model.

The text is whatever an operator saved: tabs or spaces, a terminal's escapes, a cut-off end; every
refusal names the line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from netmon.topology.model import (
    P2P_STATUSES,
    Gpu,
    Nic,
    P2PMatrix,
    Pair,
    PathClass,
    Topology,
    is_path_class_code,
)

# --- Parsing `nvidia-smi topo -m` -------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_NIC_RE = re.compile(r"^NIC\d+$")
# Drivers before the NIC Legend headed NIC columns with the device itself ("mlx5_0").
_DEVICE_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# Headings of the columns after the matrix, each written as several words.
_INFO_HEADINGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("CPU", "Affinity"), "cpu"),
    (("NUMA", "Affinity"), "numa"),
    (("GPU", "NUMA", "ID"), "gpu_numa"),
)


@dataclass(frozen=True)
class _Header:
    columns: tuple[str, ...]  # matrix columns: GPU0.., then NICs
    info: tuple[str, ...]  # the known columns after the matrix, in order
    open_ended: bool  # more (unknown) headings follow `info`


@dataclass(frozen=True)
class _Row:
    lineno: int
    cells: tuple[str, ...]
    info: tuple[str, ...]


def _clean_lines(text: str) -> list[str]:
    # A terminal gets the header underlined; a copy of it keeps the escapes.
    return [_ANSI_RE.sub("", line).rstrip() for line in text.splitlines()]


def _first_content(lines: Sequence[str], what: str) -> int:
    for n, line in enumerate(lines):
        if line.strip():
            return n
    raise ValueError(f"not {what}: the text is empty")


def _read_header(line: str, lineno: int, what: str) -> _Header:
    words = line.split()
    if not words or not _GPU_RE.match(words[0]):
        raise ValueError(
            f"line {lineno}: not {what}: expected a header starting with GPU0, got {line.strip()!r}"
        )
    columns: list[str] = []
    info: list[str] = []
    i = 0
    while i < len(words):
        heading = next(
            (
                (parts, name)
                for parts, name in _INFO_HEADINGS
                if tuple(words[i : i + len(parts)]) == parts
            ),
            None,
        )
        if heading is not None:
            info.append(heading[1])
            i += len(heading[0])
            continue
        if info:
            # A column a newer nvidia-smi added: the known ones before it still line up.
            return _Header(tuple(columns), tuple(info), open_ended=True)
        word = words[i]
        if word in columns:
            raise ValueError(f"line {lineno}: column {word} appears twice in the header")
        if _GPU_RE.match(word) and any(not _GPU_RE.match(c) for c in columns):
            raise ValueError(f"line {lineno}: {word} after the NIC columns")
        if not (_GPU_RE.match(word) or _NIC_RE.match(word) or _DEVICE_RE.match(word)):
            raise ValueError(f"line {lineno}: unexpected column heading {word!r} in the header")
        columns.append(word)
        i += 1
    return _Header(tuple(columns), tuple(info), open_ended=False)


def _read_rows(
    lines: Sequence[str], start: int, header: _Header, what: str
) -> tuple[dict[str, _Row], int]:
    """The matrix rows after the header, up to the first blank line or the Legend; and the
    index of the line after them."""
    rows: dict[str, _Row] = {}
    width = len(header.columns)
    n = start
    while n < len(lines):
        line = lines[n]
        lineno = n + 1
        words = line.split()
        if not words or any(word.startswith("Legend") for word in words[:2]):
            break  # "Legend:", "NIC Legend:"
        label = words[0]
        if label not in header.columns:
            raise ValueError(
                f"line {lineno}: not {what}: expected a row for one of "
                f"{', '.join(header.columns)}, got {line.strip()!r}"
            )
        if label in rows:
            raise ValueError(f"line {lineno}: a second row for {label}")
        cells = tuple(words[1 : 1 + width])
        if len(cells) < width:
            raise ValueError(
                f"line {lineno}: the {label} row has {len(cells)} cells for {width} columns "
                "(a cut line?)"
            )
        for column, cell in zip(header.columns, cells, strict=True):
            # Whitespace splitting would shift a row with an empty cell; X off the diagonal
            # (or none on it) is how that shows.
            if (cell == "X") != (column == label):
                raise ValueError(
                    f"line {lineno}: cell {label}/{column} is {cell!r}: X belongs exactly on "
                    "the diagonal, so the columns do not line up"
                )
        info = tuple(words[1 + width :])
        if label.startswith("GPU") and len(info) > len(header.info) and not header.open_ended:
            raise ValueError(
                f"line {lineno}: {len(info)} values after the matrix but the header names "
                f"{len(header.info)} columns"
            )
        rows[label] = _Row(lineno, cells, info)
        n += 1
    return rows, n


def _optional_int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse_topo_matrix(text: str) -> Topology:
    """The topology in `nvidia-smi topo -m` output: tab- or space-separated, with or without
    NIC columns, the info columns and the Legends.

    A cut-off text parses as far as it goes: a GPU row missing is filled from the other GPUs'
    rows (the matrix is symmetric), a missing NIC row or NIC Legend costs nothing. Raises
    ValueError naming the line when the text is no such matrix or a row does not fit its header.
    """
    what = "an `nvidia-smi topo -m` matrix"
    lines = _clean_lines(text)
    head = _first_content(lines, what)
    header = _read_header(lines[head], head + 1, what)
    rows, end = _read_rows(lines, head + 1, header, what)

    def cell(row: str, column: str) -> PathClass | None:
        found = rows.get(row)
        if found is None:
            return None
        raw = found.cells[header.columns.index(column)]
        try:
            return PathClass.parse(raw)
        except ValueError as exc:
            raise ValueError(f"line {found.lineno}: {exc}") from None

    gpu_columns = [c for c in header.columns if _GPU_RE.match(c)]
    nic_columns = [c for c in header.columns if not _GPU_RE.match(c)]
    # Parse every cell, NIC-to-NIC too, so a bad cell anywhere is reported.
    for row in rows:
        for column in header.columns:
            cell(row, column)

    path: dict[Pair, PathClass] = {}
    for a in gpu_columns:
        for b in gpu_columns:
            if a == b:
                continue
            found = cell(a, b) or cell(b, a)
            if found is None:
                raise ValueError(f"no row for {a} or {b}: their path is unknown (cut-off text?)")
            path[(_gpu_index(a), _gpu_index(b))] = found

    nic_path: dict[tuple[int, str], PathClass] = {}
    for gpu in gpu_columns:
        for nic in nic_columns:
            found = cell(gpu, nic) or cell(nic, gpu)
            if found is not None:
                nic_path[(_gpu_index(gpu), nic)] = found

    legend: dict[str, str] = {}
    for line in lines[end:]:
        match = _LEGEND_RE.match(line)
        if match:
            legend[match.group(1)] = match.group(2)

    gpus = []
    for column in gpu_columns:
        found_row = rows.get(column)
        info = dict(zip(header.info, found_row.info, strict=False)) if found_row else {}
        cpu = info.get("cpu")
        gpus.append(
            Gpu(
                index=_gpu_index(column),
                numa=_optional_int(info.get("numa")),
                cpu_affinity=None if cpu in (None, "N/A") else cpu,
            )
        )
    nics = tuple(
        Nic(name, legend.get(name, None if _NIC_RE.match(name) else name)) for name in nic_columns
    )
    return Topology(
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        nics=nics,
        path=path,
        nic_path=nic_path,
    )


def _gpu_index(label: str) -> int:
    match = _GPU_RE.match(label)
    assert match is not None  # only called on labels _GPU_RE accepted
    return int(match.group(1))


# --- Parsing `nvidia-smi topo -p2p <r|w|n|a|p>` -----------------------------------------------


def parse_p2p_matrix(text: str) -> P2PMatrix:
    """The status matrix of `nvidia-smi topo -p2p rw` (or r, w, n, a, p). ValueError naming the
    line when the text is not one (a `topo -m` matrix is refused with a pointer to
    parse_topo_matrix)."""
    what = "an `nvidia-smi topo -p2p` matrix"
    lines = _clean_lines(text)
    head = _first_content(lines, what)
    header = _read_header(lines[head], head + 1, what)
    if header.info or any(not _GPU_RE.match(c) for c in header.columns):
        raise ValueError(
            f"line {head + 1}: not {what}: the header has NIC or affinity columns, as "
            "`nvidia-smi topo -m` writes; read it with parse_topo_matrix"
        )
    rows, _ = _read_rows(lines, head + 1, header, what)
    status: dict[Pair, str] = {}
    for label, row in rows.items():
        for column, code in zip(header.columns, row.cells, strict=True):
            if label == column:
                continue
            if code not in P2P_STATUSES:
                hint = (
                    " (a path class: this looks like `nvidia-smi topo -m`; use parse_topo_matrix)"
                    if is_path_class_code(code)
                    else ""
                )
                raise ValueError(f"line {row.lineno}: cell {code!r} is not a P2P status{hint}")
            status[(_gpu_index(label), _gpu_index(column))] = code
    return P2PMatrix(gpus=tuple(sorted(_gpu_index(c) for c in header.columns)), status=status)
