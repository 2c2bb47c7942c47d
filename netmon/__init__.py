"""netmon: GPU interconnect probes (NCCL or gloo collectives) and their Prometheus exporter."""

from __future__ import annotations

__version__ = "0.1.0"
