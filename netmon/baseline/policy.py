"""How a series is learned and judged: the settings under `baseline:` (docs/SIGNAL.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netmon.bandwidth import MAX_PROBE_SIZE, bounded_size
from netmon.schema import SIZE_TEXT, also


class BaselinePolicy(BaseModel):
    """How a baseline is learned (median of the last K healthy results), the long-term reference
    beside it, and when a series is degraded or cleared (docs/SIGNAL.md, "The rule")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: int = Field(default=20, ge=1)  # K: the baseline is the median of the last K learned
    min_samples: int = Field(default=5, ge=1)  # healthy results needed before any verdict
    # Once a series has a baseline, a result within the band is learned only after this many
    # results more have come and the series is still healthy: the first results of a cut
    # must not be learned before the verdict turns on them.
    learn_delay: int = Field(default=20, ge=0)
    ratio: float = Field(default=0.8, gt=0, le=1, allow_inf_nan=False)  # R: low below R x expected
    # The low line is never under floor x expected: a spread so wide that only a near-zero result
    # would count as low is reported (netmon_judged_at_floor) and judged at the floor instead.
    floor: float = Field(default=0.7, gt=0, le=1, allow_inf_nan=False)
    trigger: int = Field(default=3, ge=1)  # M: low results among the last N that degrade
    of: int = Field(default=5, ge=1)  # N: how many recent results the M-of-N rule looks at
    # The recent level is the median of the last `level_window` conclusive results: under its
    # line the series is degraded (reason "drift"), and a degradation clears only once it is
    # back over the clearing line. Longer than `of`, so that a short burst of good results in
    # a held cut does not clear it; never longer than `window` (level_size).
    level_window: int = Field(default=9, ge=1)
    # k: a low result is also more than k robust spreads (1.4826 x MAD) under the expected level.
    spread_k: float = Field(default=3.0, ge=0, allow_inf_nan=False)
    # Sizes under this are latency-bound: a fixed ratio on their busbw reads host jitter as a
    # fault. They are judged with latency_ratio (latency over baseline / latency_ratio is low:
    # 0.6, a rise of 1.67x), or with latency_ratio null learned and shown but never judged.
    # A daemon on CPU ranks leaves it null unless it is set (for_ranks): gloo's latency is the
    # host scheduler's (docs/SIGNAL.md, "Latency").
    latency_bound_below: int = Field(
        default=1 << 20, ge=0, le=MAX_PROBE_SIZE, json_schema_extra=also(SIZE_TEXT)
    )
    latency_ratio: float | None = Field(default=0.6, gt=0, le=1, allow_inf_nan=False)
    # The first results of each series after the daemon starts, after its rank zygote is
    # replaced and after a pause longer than twice its interval are neither learned nor judged:
    # a first run pays cold caches, a new rank zygote, a first CUDA context.
    settle: int = Field(default=2, ge=0)
    # A result measured while other processes used this share of the machine's CPUs or more
    # (netmon.probe.cpushare; judged on CPU ranks only) was disturbed: inconclusive.
    max_foreign_cpu: float = Field(default=0.25, gt=0, le=1, allow_inf_nan=False)
    # A result whose cv is over noisy_cv x the series' usual cv (and over noisy_cv_floor) is
    # inconclusive, unless `trigger` of the last `of` were noisy: noise that lasts (a flapping
    # link is noisy too) is the series' state, and is judged.
    noisy_cv: float = Field(default=3.0, ge=1, allow_inf_nan=False)
    noisy_cv_floor: float = Field(default=0.05, ge=0, allow_inf_nan=False)
    # A degradation clears only once the median of its last `clear_window` results since it
    # turned (and the recent level) are back over the clearing line: a burst of good results
    # inside a held cut is not a repair. At most long_window.
    clear_window: int = Field(default=30, ge=1)
    # The long level is the median of the last `long_window` conclusive results: judged against
    # the reference, it reads a slow loss of a few percent that single results hide in noise.
    long_window: int = Field(default=120, ge=1)
    # The reference is learned over hours of healthy results: once they span
    # `reference_hours` (a day: every phase of a daily swing) with at least
    # `reference_min_hours` of them holding results, it is fixed.
    reference_hours: int = Field(default=24, ge=1)
    reference_min_hours: int = Field(default=12, ge=1)
    # Once the reference is fixed, a long level more than `decline_margin` under it (or
    # `decline_k` x the spread of its hours, where the series wanders more) is a decline.
    decline_margin: float = Field(default=0.08, gt=0, lt=1, allow_inf_nan=False)
    decline_k: float = Field(default=6.0, ge=0, allow_inf_nan=False)
    # ... held for `decline_hold` results in a row (a wander dips and comes back; a decline
    # stays). Under the tolerance (ratio x the reference) it turns at once.
    decline_hold: int = Field(default=180, ge=1)
    # A loss within the tolerance (the recent level over its line, the long level over ratio x
    # the reference) held for `accept_after` results in a row is accepted: the verdict clears
    # and the baseline starts from the new level. A loss beyond the tolerance never is.
    accept_after: int = Field(default=30, ge=1)
    # ... and only once the level holds: its hour medians over the last `steady_hours` fall by
    # less than `steady_slope` (relative) an hour. A slow decline is never accepted.
    steady_hours: int = Field(default=12, ge=3)
    steady_slope: float = Field(default=0.0025, ge=0, allow_inf_nan=False)
    # A series whose every hour of the last `upgrade_hours` ran over its mature reference by
    # more than the tolerance (over reference / ratio: a new driver or NCCL) takes the reference
    # up there; by more than decline_margin only, it is stale (netmon_reference_stale).
    upgrade_hours: int = Field(default=12, ge=3)
    # Flapping: at least `flap_trigger` of the last `flap_window` results low or noisy while
    # as many were healthy.
    flap_window: int = Field(default=20, ge=2)
    flap_trigger: int = Field(default=4, ge=2)
    # ... and more where the series has its own share of bad results (a heavy tail: a noisy
    # neighbour): as many that a healthy window holds that many with a chance under
    # `flap_alpha` (a binomial tail at the series' rate of bad results over about
    # `flap_rate_results` results, while healthy; a new series starts from `flap_base_rate`
    # weighted as `flap_prior` results). 1e-7 a window: about 0.05 false turns a series-year
    # at one result a minute (docs/SIGNAL.md, "The false-alarm budget").
    flap_alpha: float = Field(default=1e-7, gt=0, lt=1, allow_inf_nan=False)
    flap_rate_results: int = Field(default=1440, ge=10)
    flap_base_rate: float = Field(default=0.01, gt=0, lt=0.5, allow_inf_nan=False)
    flap_prior: int = Field(default=100, ge=1)

    @field_validator("latency_bound_below", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if isinstance(value, str):
            return bounded_size(value, MAX_PROBE_SIZE, "a probe moves")
        return value

    def latency_bound(self, size_bytes: int) -> bool:
        # The measured size can be a few bytes under the configured one (whole elements per
        # rank: a 1M all_gather on 3 ranks moves 1048572 B); 1 % keeps it on its side.
        return size_bytes * 1.01 < self.latency_bound_below

    def for_ranks(self, backend: str | None) -> BaselinePolicy:
        """The policy a daemon judges with on `backend`'s ranks. On CPU ranks (gloo) a
        latency-bound size is shown, not judged, unless latency_ratio is set in the config: its
        time is how soon the host wakes a rank, which spreads 3-19x between a busy host's 5th
        and 95th percentiles (docs/SIGNAL.md, "Latency"); on GPUs it is the link's and NCCL's."""
        if backend == "nccl" or "latency_ratio" in self.model_fields_set:
            return self
        return self.model_copy(update={"latency_ratio": None})

    def judges(self, size_bytes: int) -> bool:
        return not self.latency_bound(size_bytes) or self.latency_ratio is not None

    def ratio_for(self, size_bytes: int) -> float:
        if self.latency_bound(size_bytes) and self.latency_ratio is not None:
            return self.latency_ratio
        return self.ratio

    @property
    def level_size(self) -> int:
        # Never longer than the baseline window: the recent level must follow a change (a
        # better link, say) before the baseline does, or it would read the change as a fall.
        return min(self.level_window, self.window)

    def floor_for(self, size_bytes: int) -> float:
        # A latency tolerance (0.5: twice the latency) may be wider than the bandwidth floor.
        return min(self.floor, self.ratio_for(size_bytes))

    @model_validator(mode="after")
    def _consistent(self) -> BaselinePolicy:
        if self.min_samples > self.window:
            raise ValueError(
                f"min_samples ({self.min_samples}) must be <= window ({self.window}), "
                "or the window can never hold enough results for a baseline"
            )
        if self.floor > self.ratio:
            raise ValueError(
                f"floor ({self.floor}) must be <= ratio ({self.ratio}): the floor is the "
                "lowest the low line may go, and ratio is where it starts"
            )
        if self.trigger > self.of:
            raise ValueError(
                f"trigger ({self.trigger}) must be <= of ({self.of}): M of the last N results"
            )
        if self.clear_window > self.long_window:
            raise ValueError(
                f"clear_window ({self.clear_window}) must be <= long_window ({self.long_window}):"
                " the results it takes its median of are the long level's"
            )
        if 2 * self.flap_trigger > self.flap_window:
            raise ValueError(
                f"flap_trigger ({self.flap_trigger}) must be at most half of flap_window "
                f"({self.flap_window}): flapping needs that many bad and that many healthy results"
            )
        if self.reference_min_hours > self.reference_hours:
            raise ValueError(
                f"reference_min_hours ({self.reference_min_hours}) must be <= reference_hours "
                f"({self.reference_hours}): the hours with results lie within the span"
            )
        # With 2M <= N, "M low" and "M healthy" can hold at once and the verdict would flip on
        # every result; a strict majority makes the two rules exclusive.
        if 2 * self.trigger <= self.of:
            raise ValueError(
                f"trigger ({self.trigger}) must be more than half of of ({self.of}), "
                "or degrading and clearing could both apply and the verdict would flap"
            )
        return self
