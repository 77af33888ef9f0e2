"""The command line: light to start, and every worker setting listed."""

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_building_the_command_line_imports_no_torch() -> None:
    code = (
        "import sys, genfleet.cli\n"
        "genfleet.cli.build_parser()\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    assert _run(code) == "[]"


@pytest.mark.parametrize("command", ["worker", "api"])
def test_help_lists_every_setting_with_its_environment_name(command: str) -> None:
    from producer_api.settings import ApiSettings
    from worker.service.settings import WorkerSettings

    settings = {"worker": WorkerSettings, "api": ApiSettings}[command]
    result = subprocess.run(
        [sys.executable, "-m", "genfleet.cli", command, "--help"], capture_output=True, text=True
    )
    help_text = " ".join(result.stdout.split())
    for name in settings.model_fields:
        assert f"--{name.replace('_', '-')}" in help_text
        assert f"GENFLEET_{name.upper()}" in help_text


def test_settings_come_from_flags_then_environment(monkeypatch) -> None:
    import argparse

    from genfleet.settings_flags import add_settings_arguments, settings_from_args
    from worker.service.settings import WorkerSettings

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, WorkerSettings)
    monkeypatch.setenv("GENFLEET_REDIS_URL", "redis://example:1/0")
    monkeypatch.setenv("GENFLEET_MAX_NUM_SEQS", "7")
    args = parser.parse_args(["--max-num-seqs", "9", "--kafka-idempotence"])
    settings = settings_from_args(args, WorkerSettings)
    assert settings.max_num_seqs == 9
    assert settings.redis_url == "redis://example:1/0"
    assert settings.kafka_idempotence is True


def test_bench_and_up_take_the_engines_knobs_from_its_definitions() -> None:
    from pathlib import Path

    from genfleet.bench.run import _engine_config, _worker_settings
    from genfleet.cli import build_parser
    from genfleet.settings_flags import as_flags, given_settings
    from worker.config import EngineConfig

    bench = build_parser().parse_args(
        ["bench", "--model", "m", "--seed", "5", "--max-num-seqs", "7", "--no-enforce-eager",
         "--dense-weights-memory-gib", "0"]
    )  # fmt: skip
    config = _engine_config(bench, Path("/models/m"), "bfloat16")
    assert (config.model, config.seed, config.max_num_seqs, config.enforce_eager) == (
        "/models/m", 5, 7, False,
    )  # fmt: skip
    assert config.dense_weights_memory_gib == 0
    assert config.max_num_batched_tokens == EngineConfig().max_num_batched_tokens  # not given
    worker = _worker_settings(bench, Path("/models/m"))
    assert (worker.model, worker.max_num_seqs, worker.dtype) == ("/models/m", 7, "bfloat16")
    assert worker.dense_weights_memory_gib == 0

    up = build_parser().parse_args(
        ["up", "--max-num-seqs", "9", "--override-generation-config", '{"temperature": 0.1}']
    )
    flags = as_flags(given_settings(up, EngineConfig))
    assert flags == ["--max-num-seqs", "9", "--override-generation-config", '{"temperature": 0.1}']
    again = build_parser().parse_args(["worker", *flags])
    assert given_settings(again, EngineConfig) == {
        "max_num_seqs": "9", "override_generation_config": '{"temperature": 0.1}',
    }  # fmt: skip


def test_up_passes_the_reply_settings_on_to_its_workers() -> None:
    from genfleet.cli import build_parser
    from genfleet.settings_flags import settings_from_args
    from genfleet.up import reply_flags
    from worker.service.settings import WorkerSettings

    up = build_parser().parse_args(
        ["up", "--reasoning-parser", "qwen3", "--no-enable-auto-tool-choice", "--max-num-seqs", "9"]
    )
    flags = reply_flags(up)
    assert "--max-num-seqs" not in flags  # an engine knob: passed with the others
    worker = settings_from_args(build_parser().parse_args(["worker", *flags]), WorkerSettings)
    assert worker.reasoning_parser == "qwen3" and worker.enable_auto_tool_choice is False
    assert worker.tool_call_parser is None  # not given: the template's
    assert reply_flags(build_parser().parse_args(["up"])) == []
