"""The daemon's flags override its file's settings without judging the file again (issue 49):
the file's own text is validated once, with the flags in it, so a setting the file may hold is
accepted alike with and without them (`min_busbw: 1K` read back as 1000.0 was refused)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from netmon.cli.daemon_config import load_daemon_config
from netmon.errors import ConfigError

FILE = """\
backend: gloo
listen: 127.0.0.1:19464
logging: {format: json}
probes:
  - name: small
    sizes: [8, 1K]
    interval: 30s
    min_busbw: 1K
"""


def _args(path: Path, **flags: object) -> argparse.Namespace:
    given = {"listen": None, "log_level": None, "log_format": None, "state_dir": None, **flags}
    return argparse.Namespace(config=path, **given)


def test_a_small_rate_with_its_suffix_is_accepted_with_and_without_flags(tmp_path: Path) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text(FILE)
    plain, _ = load_daemon_config(_args(path))
    flagged, _ = load_daemon_config(
        _args(path, listen="127.0.0.1:0", log_level="debug", state_dir=tmp_path / "s")
    )
    assert plain.probes[0].min_busbw == flagged.probes[0].min_busbw == 1000.0
    assert (plain.listen, flagged.listen) == ("127.0.0.1:19464", "127.0.0.1:0")
    assert flagged.state_dir == tmp_path / "s"
    # A flag's mapping merges into the file's: the format the file gave stays.
    assert (flagged.logging.format, flagged.logging.level) == ("json", "debug")
    assert plain.logging.level != "debug"


def test_a_bad_flag_is_still_named(tmp_path: Path) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text(FILE)
    with pytest.raises(ConfigError, match="listen"):
        load_daemon_config(_args(path, listen="nowhere"))
