"""The representations /metrics can take: the exposition format a scraper's Accept header picks
and whether its Accept-Encoding lets the body be gzipped. The negotiation is prometheus_client's
(`choose_encoder`, `gzip_accepted`); this module only names its answer, so a page can cache a
body per representation.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prometheus_client.exposition import (
    CONTENT_TYPE_PLAIN_0_0_4,
    choose_encoder,
    generate_latest,
    gzip_accepted,
)
from prometheus_client.registry import Collector

Encoder = Callable[[Collector], bytes]


@dataclass(frozen=True)
class Format:
    """One representation of the page: equal formats give the same bytes for the same metrics.

    The content type names the encoder (format, version and name escaping), so it alone is
    compared: choose_encoder builds a new encoder object on every call.
    """

    content_type: str
    gzip: bool = False
    encode: Encoder = field(default=generate_latest, compare=False, repr=False)

    def render(self, registry: Collector) -> bytes:
        body = self.encode(registry)
        # As prometheus_client's own servers compress (exposition._bake_output).
        return gzip.compress(body) if self.gzip else body


# The text format 0.0.4, uncompressed: the answer to a scraper that states no preference.
TEXT = Format(CONTENT_TYPE_PLAIN_0_0_4)

# /metrics as a function of the representation asked for.
Page = Callable[[Format], bytes]


# A Content-Type we may send: printable ASCII, so no CR or LF.
_HEADER_VALUE = re.compile(r"[ -~]+")


def negotiate(accept: str | None, accept_encoding: str | None) -> Format:
    """The representation for these request headers (either may be absent). An Accept header
    prometheus_client cannot read gets the text format, as one naming nothing known does."""
    gzipped = gzip_accepted(accept_encoding or "")
    try:
        encode, content_type = choose_encoder(accept or "")
    except (TypeError, ValueError):
        # A version such as "1.x" or "1..0": choose_encoder compares "x" with a number.
        return replace(TEXT, gzip=gzipped)
    if not _HEADER_VALUE.fullmatch(content_type):
        # choose_encoder echoes the version asked for, and a folded header line (obsolete but
        # parsed) carries CR LF into it: sent back, that would add headers to our response.
        return replace(TEXT, gzip=gzipped)
    return Format(content_type, gzipped, encode)
