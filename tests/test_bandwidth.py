from __future__ import annotations

import math

import pytest

from netmon import bandwidth as bw


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("64K", 65536),
        ("16M", 16 << 20),
        ("1G", 1 << 30),
        ("1KiB", 1024),
        ("2kb", 2048),
        (4096, 4096),
        ("0.5K", 512),
    ],
)
def test_sizes_use_binary_suffixes_like_nccl_tests(text: str | int, expected: int) -> None:
    assert bw.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "1X", "-1", "1.3", "ten", True])
def test_bad_sizes_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"size|whole|bytes"):
        bw.parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5G", 1.5e9),
        ("1.5GB/s", 1.5e9),
        ("200M", 2e8),
        ("10K", 1e4),
        (3e9, 3e9),
        ("1e9", 1e9),
        ("0", 0.0),
        ("2000000", 2e6),
    ],
)
def test_rates_use_decimal_suffixes_like_gb_per_s(text: str | float, expected: float) -> None:
    assert bw.parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["150", 150, "10", 0.5, "999999"])
def test_a_bare_rate_under_1_mb_per_s_is_refused_with_the_suffix_it_meant(
    text: str | float,
) -> None:
    # "--min-busbw 150" meant 150 GB/s; as 150 B/s the gate could never fail.
    with pytest.raises(ValueError, match=rf"under 1 MB/s: did you mean {float(text):g}G\?"):
        bw.parse_rate(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("60s", 60.0), ("15m", 900.0), ("1h", 3600.0), ("500ms", 0.5), (2, 2.0), ("3", 3.0)],
)
def test_durations(text: str | float, expected: float) -> None:
    assert bw.parse_duration(text) == expected


def test_bad_duration() -> None:
    with pytest.raises(ValueError, match="duration"):
        bw.parse_duration("soon")


def test_sweep_matches_nccl_tests_b_e_f() -> None:
    assert bw.size_sweep(8, 128, 2) == [8, 16, 32, 64, 128]
    assert bw.size_sweep(1 << 20, 1 << 30, 4) == [
        1 << 20,
        4 << 20,
        16 << 20,
        64 << 20,
        256 << 20,
        1 << 30,
    ]
    with pytest.raises(ValueError):
        bw.size_sweep(64, 8, 2)
    with pytest.raises(ValueError):
        bw.size_sweep(8, 64, 1)


def test_format_size() -> None:
    assert [bw.format_size(s) for s in (8, 65536, 16 << 20, 1 << 30, 1000)] == [
        "8",
        "64K",
        "16M",
        "1G",
        "1000",
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
def test_bus_factors_of_performance_md(n: int) -> None:
    assert bw.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    spread_ops: tuple[bw.OpName, ...] = ("all_gather", "reduce_scatter", "alltoall")
    for op in spread_ops:
        assert bw.bus_factor(op, n) == pytest.approx((n - 1) / n)
    for op in ("broadcast", "sendrecv"):
        assert bw.bus_factor(op, n) == 1.0


def test_busbw_for_8_gpu_all_reduce() -> None:
    # 1 GiB in 8 ms on 8 ranks: algbw 134.2 GB/s, busbw x 1.75.
    algbw = bw.algbw(1 << 30, 0.008)
    assert algbw == pytest.approx(134.217728e9)
    assert bw.busbw("all_reduce", 8, 1 << 30, 0.008) == pytest.approx(algbw * 1.75)
    assert bw.algbw(100, 0.0) == 0.0


def test_buffers_follow_nccl_tests_size_semantics() -> None:
    # all_gather/reduce_scatter: S is the gathered total, rounded down to a multiple of ranks.
    gather = bw.buffers_for("all_gather", 1 << 20, 3, "float32")
    assert (gather.in_count, gather.out_count) == (87381, 262143)
    assert gather.size_bytes == 262143 * 4
    scatter = bw.buffers_for("reduce_scatter", 1 << 20, 3, "float32")
    assert (scatter.in_count, scatter.out_count) == (262143, 87381)
    a2a = bw.buffers_for("alltoall", 1 << 20, 3, "bfloat16")
    assert a2a.in_count == a2a.out_count == 524286
    reduce = bw.buffers_for("all_reduce", 8, 4, "float16")
    assert (reduce.count, reduce.size_bytes) == (4, 8)
    # In place: no output buffer of its own.
    assert (reduce.in_count, reduce.out_count, reduce.element_bytes) == (4, 0, 2)
    # Never an empty buffer: one element per rank at least.
    tiny = bw.buffers_for("all_gather", 4, 8, "float32")
    assert (tiny.in_count, tiny.size_bytes) == (1, 32)


MIB, S_3 = 1 << 20, 1048572  # 1 MiB of float32 at 3 ranks: S rounded down to 3 x 87381 floats


@pytest.mark.parametrize(
    ("op", "size", "ranks", "dtype", "expected"),
    [
        # all_reduce and broadcast in place: S.
        ("all_reduce", MIB, 3, "float32", MIB),
        ("broadcast", MIB, 3, "float32", MIB),
        ("all_reduce", 256 * MIB, 2, "float32", 268435456),
        # all_gather S/n in, S out; reduce_scatter S in, S/n out; all_gather_object as all_gather.
        ("all_gather", MIB, 3, "float32", 349524 + S_3),
        ("reduce_scatter", MIB, 3, "float32", S_3 + 349524),
        ("all_gather_object", MIB, 3, "float32", 349524 + S_3),
        ("all_gather", 256 * MIB, 2, "float32", 402653184),
        # alltoall and sendrecv: S in, S out.
        ("alltoall", MIB, 3, "float32", 2 * S_3),
        ("alltoall", MIB, 3, "bfloat16", 2 * S_3),
        ("sendrecv", MIB, 3, "float32", 2 * MIB),
        ("sendrecv", 256 * MIB, 2, "float16", 536870912),
        # Never empty: one element per rank at least.
        ("all_gather", 4, 8, "float32", 36),
        ("alltoall", 4, 8, "float32", 64),
        ("all_reduce", 1, 2, "float32", 4),
    ],
)
def test_buffer_budget_is_what_one_rank_allocates_for_the_op(
    op: bw.OpName, size: int, ranks: int, dtype: bw.DTypeName, expected: int
) -> None:
    assert bw.buffer_budget(op, size, ranks, dtype) == expected


def test_every_op_has_a_budget_of_its_own_shape() -> None:
    # 1 GiB at 8 ranks: S exact, S/n = 128 MiB. Every op is listed, so a new op needs a budget.
    gib, s_n = 1 << 30, 128 << 20
    assert {op: bw.buffer_budget(op, gib, 8, "float32") for op in bw.OPS} == {
        "all_reduce": gib,
        "broadcast": gib,
        "all_gather": s_n + gib,
        "reduce_scatter": gib + s_n,
        "alltoall": 2 * gib,
        "sendrecv": 2 * gib,
        "all_gather_object": s_n + gib,
    }


def test_spread_statistics() -> None:
    s = bw.spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.min, s.max, s.samples) == (3.0, 1.0, 5.0, 5)
    assert s.p10 == pytest.approx(1.4)
    assert s.p90 == pytest.approx(4.6)
    assert s.cv == pytest.approx(math.sqrt(2) / 3)
    single = bw.spread([2.0])
    assert (single.cv, single.p10, single.p90) == (0.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        bw.spread([])


def test_a_samples_time_over_ranks_is_the_slowest_the_mean_or_the_fastest() -> None:
    per_rank = [[1.0, 4.0, 2.0], [3.0, 2.0, 2.0]]
    assert bw.combine_ranks(per_rank, "max") == [3.0, 4.0, 2.0]
    assert bw.combine_ranks(per_rank, "min") == [1.0, 2.0, 2.0]
    assert bw.combine_ranks(per_rank, "mean") == [2.0, 3.0, 2.0]
    assert bw.rank_medians(per_rank) == (2.0, 2.0)
    with pytest.raises(ValueError, match="same number of samples"):
        bw.combine_ranks([[1.0], [1.0, 2.0]], "max")
    with pytest.raises(ValueError):
        bw.combine_ranks([], "mean")
