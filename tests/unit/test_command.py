"""The subcommand preamble: exit statuses, configuration errors, failures and logging set-up."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from common import command, config
from common.config import Setting
from common.errors import ConfigError, QuotientError

SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="size", parse=config.parse_port, default=1, help="a number"),
    *config.LOG_SETTINGS,
)


def _prepare(values: Mapping[str, object]) -> int:
    size = int(str(values["size"]))
    if size == 7:
        raise ConfigError("--size: 7 is refused")
    return size


def test_a_service_that_ends_exits_zero_with_its_prepared_settings() -> None:
    seen: list[int] = []

    async def serve(size: int) -> None:
        seen.append(size)

    status = command.run_service(
        ["--size", "42"], prog="quotient test", description="t", settings=SETTINGS, prepare=_prepare, serve=serve
    )
    assert (status, seen) == (command.EXIT_OK, [42])


@pytest.mark.parametrize("argv", [["--size", "notaport"], ["--size", "7"]])
def test_a_refused_configuration_exits_two_and_says_why(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    async def serve(size: int) -> None:
        raise AssertionError("must not run")

    status = command.run_service(
        argv, prog="quotient test", description="t", settings=SETTINGS, prepare=_prepare, serve=serve
    )
    assert status == command.EXIT_REFUSED
    assert capsys.readouterr().err.startswith("quotient test: --size")


def test_a_failure_while_serving_exits_one_and_is_logged(capsys: pytest.CaptureFixture[str]) -> None:
    async def serve(size: int) -> None:
        raise QuotientError("the API went away")

    status = command.run_service(
        [], prog="quotient test", description="t", settings=SETTINGS, prepare=_prepare, serve=serve
    )
    assert status == command.EXIT_FAILED
    assert "event=test_failed" in capsys.readouterr().err
