"""A store with one saved regression report, made by a real ``tracedag regress`` run (v2 fails half
the tool calls of v1, so the gate fails on ``pass_rate``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from tests.regress.regress_support import gate_store, half
from tracedag.pipeline.cli import cli

ARGS = ["--baseline", "service_version=v1", "--candidate", "service_version=v2", "--seed", "3", "--resamples", "200"]


def regress_report_store(data: Path) -> tuple[Path, str, dict[str, Any]]:
    """The store, the saved report's name, and the JSON the same run printed (``--format json``)."""
    gate_store(data, {"v1": {}, "v2": {"fails": half}})
    table = CliRunner().invoke(cli, ["regress", "--data", str(data), *ARGS], catch_exceptions=False)
    assert table.exit_code == 1, table.output
    saved = re.search(r"^saved (\S+/(regress-\d{8}T\d{6}Z-[0-9a-f]{8})\.json) ", table.output, re.MULTILINE)
    assert saved, table.output
    nosave = CliRunner().invoke(cli, ["regress", "--data", str(data), *ARGS, "--format", "json", "--no-save"],
                                catch_exceptions=False)
    assert len(list((data / "reports").iterdir())) == 1  # --no-save wrote nothing
    return data, saved.group(2), json.loads(nosave.output)
