"""``quotient scheduler``'s settings reach the engine: the reclaim eviction budget, off by default as in KAI."""

from __future__ import annotations

import argparse

import pytest

from common import config
from common.errors import ConfigError
from scheduler.settings import SETTINGS, settings_from


def _parsed(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, SETTINGS)
    return config.resolve(SETTINGS, parser.parse_args(argv), environ=environ or {}, file_values={})


def test_reclaim_has_no_eviction_budget_unless_one_is_set_by_flag_or_environment() -> None:
    assert settings_from(_parsed([])).engine_config.reclaim_eviction_multiple == 0
    assert settings_from(_parsed(["--reclaim-eviction-multiple", "2"])).engine_config.reclaim_eviction_multiple == 2
    from_env = _parsed([], {"QUOTIENT_RECLAIM_EVICTION_MULTIPLE": "3"})
    assert settings_from(from_env).engine_config.reclaim_eviction_multiple == 3


@pytest.mark.parametrize("raw", ["-1", "1.5", "two", "101"])
def test_an_eviction_multiple_that_is_not_a_whole_number_within_0_to_100_is_refused_by_name(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"^--reclaim-eviction-multiple: .*within 0\.\.100"):
        _parsed(["--reclaim-eviction-multiple", raw])
