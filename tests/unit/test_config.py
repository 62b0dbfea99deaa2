"""common.config: flags > environment > config file > default, and errors that name the setting and its source."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from common import config
from common.config import Setting
from common.errors import ConfigError

SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="node", parse=config.parse_str, default=None, help="node name"),
    Setting(name="nats", parse=config.parse_nats_url, default="nats://127.0.0.1:4222", help="NATS URL"),
    Setting(name="interval", parse=config.parse_positive_duration_s, default=1.0, help="interval", metavar="DUR"),
    Setting(name="metrics_port", parse=config.parse_port, default=9400, help="port"),
    Setting(name="dcgm_names", parse=config.parse_bool, default=False, help="dcgm names"),
    Setting(name="seed_file", parse=config.parse_existing_file, default=None, help="seed"),
    Setting(name="proc_root", parse=config.parse_existing_dir, default=Path("/proc"), help="proc root"),
    Setting(name="secret", parse=config.parse_str, default="none", help="flag only", flag_only=True),
    *config.LOG_SETTINGS,
)


def parser_for(settings: Sequence[Setting[object]] = SETTINGS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="test")
    config.add_arguments(parser, settings)
    return parser


def resolve(
    argv: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
    file_values: Mapping[str, object] | None = None,
) -> dict[str, object]:
    args = parser_for().parse_args(list(argv))
    return config.resolve(SETTINGS, args, environ={} if environ is None else environ, file_values=file_values)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "quotient.yaml"
    path.write_text(text)
    return path


# --- precedence ---


def test_every_setting_takes_its_default_when_nothing_is_given() -> None:
    values = resolve(file_values={})
    assert values == {
        "node": None,
        "nats": "nats://127.0.0.1:4222",
        "interval": 1.0,
        "metrics_port": 9400,
        "dcgm_names": False,
        "seed_file": None,
        "proc_root": Path("/proc"),
        "secret": "none",
        "log_level": "info",
        "log_format": "logfmt",
    }


def test_a_file_value_beats_the_default() -> None:
    assert resolve(file_values={"interval": "250ms"})["interval"] == 0.25


def test_an_environment_variable_beats_the_file() -> None:
    values = resolve(environ={"QUOTIENT_INTERVAL": "2s"}, file_values={"interval": "250ms"})
    assert values["interval"] == 2.0


def test_a_flag_beats_the_environment_and_the_file() -> None:
    values = resolve(["--interval", "5s"], environ={"QUOTIENT_INTERVAL": "2s"}, file_values={"interval": "250ms"})
    assert values["interval"] == 5.0


def test_each_setting_is_resolved_from_its_own_best_source() -> None:
    values = resolve(
        ["--node", "gpu-1"],
        environ={"QUOTIENT_METRICS_PORT": "9500"},
        file_values={"log_level": "debug", "node": "from-file"},
    )
    assert (values["node"], values["metrics_port"], values["log_level"], values["interval"]) == (
        "gpu-1",
        9500,
        "debug",
        1.0,
    )


def test_the_environment_variable_is_named_after_the_setting_in_capitals() -> None:
    values = resolve(environ={"QUOTIENT_LOG_FORMAT": "json", "LOG_FORMAT": "logfmt"})
    assert values["log_format"] == "json"


def test_the_flag_is_named_after_the_setting_with_dashes() -> None:
    setting = SETTINGS[3]
    assert (setting.flag, setting.env) == ("--metrics-port", "QUOTIENT_METRICS_PORT")
    assert resolve(["--metrics-port", "0"])["metrics_port"] == 0


def test_a_flag_only_setting_ignores_the_environment() -> None:
    assert resolve(environ={"QUOTIENT_SECRET": "leaked"})["secret"] == "none"
    assert resolve(["--secret", "given"], environ={"QUOTIENT_SECRET": "leaked"})["secret"] == "given"


def test_the_process_environment_is_read_when_none_is_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTIENT_NODE", "from-env")
    args = parser_for().parse_args([])
    assert config.resolve(SETTINGS, args, file_values={})["node"] == "from-env"


# --- boolean flags ---


def test_a_boolean_flag_turns_the_setting_on() -> None:
    assert resolve(["--dcgm-names"])["dcgm_names"] is True


def test_the_negated_boolean_flag_beats_an_environment_that_turns_it_on() -> None:
    assert resolve(["--no-dcgm-names"], environ={"QUOTIENT_DCGM_NAMES": "true"})["dcgm_names"] is False


def test_an_absent_boolean_flag_leaves_the_environment_in_charge() -> None:
    assert resolve(environ={"QUOTIENT_DCGM_NAMES": "yes"})["dcgm_names"] is True


def test_a_yaml_boolean_in_the_file_is_taken_as_is() -> None:
    assert resolve(file_values={"dcgm_names": True})["dcgm_names"] is True


def test_a_boolean_flag_takes_no_value() -> None:
    with pytest.raises(SystemExit):
        parser_for().parse_args(["--dcgm-names", "true"])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
        (True, True),
        (False, False),
    ],
)
def test_booleans_are_read_in_every_usual_spelling(raw: object, expected: bool) -> None:
    assert config.parse_bool(raw) is expected


# --- the config file ---


def test_the_config_flag_reads_a_yaml_file(tmp_path: Path) -> None:
    path = write(tmp_path, "interval: 3s\nmetrics-port: 9100\ndcgm_names: true\n")
    args = parser_for().parse_args(["--config", str(path)])
    values = config.resolve(SETTINGS, args, environ={})
    assert (values["interval"], values["metrics_port"], values["dcgm_names"]) == (3.0, 9100, True)


def test_file_keys_may_be_spelled_with_dashes_or_underscores(tmp_path: Path) -> None:
    path = write(tmp_path, "log-level: warning\nlog_format: json\n")
    assert config.load_file(path) == {"log_level": "warning", "log_format": "json"}


def test_an_empty_config_file_holds_no_settings(tmp_path: Path) -> None:
    assert config.load_file(write(tmp_path, "")) == {}
    assert config.load_file(write(tmp_path, "# only a comment\n")) == {}


def test_yaml_numbers_in_the_file_are_accepted_where_a_number_makes_sense(tmp_path: Path) -> None:
    path = write(tmp_path, "interval: 2\nmetrics_port: 9100\n")
    values = resolve(file_values=config.load_file(path))
    assert (values["interval"], values["metrics_port"]) == (2.0, 9100)


def test_an_unknown_key_in_the_file_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(file_values={"intervall": "1s", "bogus": 1})
    message = str(caught.value)
    assert message.startswith("--config: unknown setting(s) bogus, intervall;")
    assert "known:" in message
    assert "interval" in message
    assert "metrics_port" in message


def test_an_unknown_key_is_an_error_even_when_a_flag_is_given(tmp_path: Path) -> None:
    path = write(tmp_path, "nodee: x\n")
    args = parser_for().parse_args(["--config", str(path), "--node", "n1"])
    with pytest.raises(ConfigError, match=r"unknown setting.*nodee"):
        config.resolve(SETTINGS, args, environ={})


def test_a_missing_config_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as caught:
        config.load_file(missing)
    assert str(caught.value).startswith("--config: cannot read ")
    assert str(missing) in str(caught.value)
    assert "No such file" in str(caught.value)


def test_a_directory_given_as_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--config: cannot read "):
        config.load_file(tmp_path)


def test_invalid_yaml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "interval: [1s\n")
    with pytest.raises(ConfigError) as caught:
        config.load_file(path)
    assert str(caught.value).startswith(f"--config: {path} is not valid YAML")


def test_a_config_file_that_is_not_a_mapping_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must hold a mapping of settings, not list"):
        config.load_file(write(tmp_path, "- interval\n- 1s\n"))
    with pytest.raises(ConfigError, match="not str"):
        config.load_file(write(tmp_path, "just text\n"))


def test_an_error_in_the_config_file_surfaces_from_resolve(tmp_path: Path) -> None:
    args = parser_for().parse_args(["--config", str(tmp_path / "absent.yaml")])
    with pytest.raises(ConfigError, match="--config: cannot read"):
        config.resolve(SETTINGS, args, environ={})


# --- errors name the setting and where the value came from ---


@pytest.mark.parametrize(
    ("setting", "flag", "env", "bad", "says"),
    [
        ("node", "--node", "QUOTIENT_NODE", "  ", "must not be empty"),
        ("nats", "--nats", "QUOTIENT_NATS", "http://x:4222", "'http://x:4222' is not a NATS URL"),
        ("interval", "--interval", "QUOTIENT_INTERVAL", "1x", "'1x' is not a duration"),
        ("interval", "--interval", "QUOTIENT_INTERVAL", "0s", "'0s' must be a positive duration"),
        ("metrics_port", "--metrics-port", "QUOTIENT_METRICS_PORT", "http", "'http' is not a port number"),
        ("metrics_port", "--metrics-port", "QUOTIENT_METRICS_PORT", "70000", "70000 is not a port number (0-65535"),
        ("metrics_port", "--metrics-port", "QUOTIENT_METRICS_PORT", "-1", "'-1' is not a port number"),
        ("seed_file", "--seed-file", "QUOTIENT_SEED_FILE", "/nonexistent/seed", "does not exist or is not a file"),
        ("proc_root", "--proc-root", "QUOTIENT_PROC_ROOT", "/nonexistent/proc", "does not exist or is not a dir"),
        ("log_level", "--log-level", "QUOTIENT_LOG_LEVEL", "loud", "'loud' is not one of debug, info, warning, error"),
        ("log_format", "--log-format", "QUOTIENT_LOG_FORMAT", "xml", "'xml' is not one of logfmt, json"),
    ],
)
def test_a_bad_value_names_the_setting_and_its_source(setting: str, flag: str, env: str, bad: str, says: str) -> None:
    with pytest.raises(ConfigError) as from_flag:
        resolve([f"{flag}={bad}"])
    assert str(from_flag.value).startswith(f"{flag}: ")
    assert says in str(from_flag.value)

    with pytest.raises(ConfigError) as from_env:
        resolve(environ={env: bad})
    assert str(from_env.value).startswith(f"{env}: ")
    assert says in str(from_env.value)

    with pytest.raises(ConfigError) as from_file:
        resolve(file_values={setting: bad})
    assert str(from_file.value).startswith(f"config file key {setting}: ")
    assert says in str(from_file.value)


def test_a_bad_boolean_in_the_environment_names_the_variable_and_the_accepted_spellings() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(environ={"QUOTIENT_DCGM_NAMES": "maybe"})
    assert str(caught.value) == ("QUOTIENT_DCGM_NAMES: 'maybe' is not a boolean (true/false, yes/no, 1/0, on/off)")


def test_a_bad_value_is_reported_from_the_source_that_won() -> None:
    # The flag is fine, so the broken environment value is never parsed.
    assert resolve(["--interval", "2s"], environ={"QUOTIENT_INTERVAL": "1x"})["interval"] == 2.0
    with pytest.raises(ConfigError, match=r"^--interval: "):
        resolve(["--interval", "1x"], environ={"QUOTIENT_INTERVAL": "2s"})


def test_a_yaml_value_of_the_wrong_kind_names_the_file_key() -> None:
    with pytest.raises(ConfigError, match=r"^config file key metrics_port: "):
        resolve(file_values={"metrics_port": [9400]})
    with pytest.raises(ConfigError, match=r"^config file key interval: "):
        resolve(file_values={"interval": {"s": 1}})


def test_the_config_error_keeps_the_parser_error_as_its_cause() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(["--metrics-port", "x"])
    assert isinstance(caught.value.__cause__, ValueError)


# --- the parsers on their own ---


def test_parse_str_strips_whitespace() -> None:
    assert config.parse_str("  gpu-1 \n") == "gpu-1"


def test_parse_port_accepts_the_whole_range_and_zero() -> None:
    assert [config.parse_port(raw) for raw in ("0", "1", 65535, " 8080 ")] == [0, 1, 65535, 8080]


def test_parse_positive_duration_reads_go_durations_and_plain_seconds() -> None:
    values = [config.parse_positive_duration_s(raw) for raw in ("500ms", "1m30s", "2", 0.5, 3)]
    assert values == [0.5, 90.0, 2.0, 0.5, 3.0]


@pytest.mark.parametrize("raw", [0, "0", "0ms", -1])
def test_parse_positive_duration_refuses_zero_and_negative(raw: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        config.parse_positive_duration_s(raw)


def test_parse_nats_url_accepts_several_schemes_comma_separated() -> None:
    urls = "nats://a:4222,tls://b:4222,ws://c:80,wss://d:443"
    assert config.parse_nats_url(urls) == urls


def test_parse_nats_url_names_the_bad_part_of_a_list() -> None:
    with pytest.raises(ValueError, match="'b:4222' is not a NATS URL"):
        config.parse_nats_url("nats://a:4222,b:4222")


def test_parse_existing_file_and_dir_tell_files_from_directories(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.write_text("SUA...")
    assert config.parse_existing_file(str(seed)) == seed
    assert config.parse_existing_dir(str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="is not a file"):
        config.parse_existing_file(str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        config.parse_existing_dir(str(seed))


def test_choice_accepts_only_its_options_after_stripping() -> None:
    parse = config.choice("a", "b")
    assert parse(" b ") == "b"
    with pytest.raises(ValueError, match="'A' is not one of a, b"):
        parse("A")


# --- argparse wiring ---


def test_no_argparse_default_leaks_so_absent_flags_read_as_none() -> None:
    args = parser_for().parse_args([])
    assert all(getattr(args, setting.name) is None for setting in SETTINGS)
    assert args.config is None


def test_help_shows_the_default_of_a_valued_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parser_for().parse_args(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert "(default: 9400)" in out
    assert "--no-dcgm-names" in out
    assert "--config FILE" in out
