"""The ``quiver`` command line alone (no server): where options may stand."""

from __future__ import annotations

import pytest
from quiver_client.cli import parser


@pytest.mark.parametrize("argv", [
    ["--json", "adapters", "ls"],
    ["adapters", "ls", "--json"],
    ["--json", "versions", "show", "bot@2"],
    ["--json", "usage", "--since", "24h"],
    ["push", "./out", "--name", "bot", "--json"],
    ["--json", "push", "./out", "--name", "bot"],
])
def test_json_is_accepted_before_or_after_the_command(argv: list[str]) -> None:
    assert parser().parse_args(argv).json is True


def test_without_json_the_flag_is_absent_and_main_defaults_it() -> None:
    # SUPPRESS keeps a subcommand's parser from resetting the top level's --json to False; main() fills in False.
    assert not hasattr(parser().parse_args(["adapters", "ls"]), "json")


def test_json_before_the_command_reaches_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver_client import cli

    seen: list[bool] = []

    def fake_ls(args: object) -> int:
        seen.append(getattr(args, "json"))  # noqa: B009 (the attribute is what is under test)
        return 0

    monkeypatch.setattr(cli, "cmd_adapters_ls", fake_ls)
    assert cli.main(["--json", "adapters", "ls"]) == 0
    assert cli.main(["adapters", "ls"]) == 0
    assert seen == [True, False]


def test_help_reads_as_plain_text_not_rest() -> None:
    # The epilog comes from the module docstring; a terminal shows reST's ``double backticks`` literally.
    text = parser().format_help()
    assert "Exit codes:" in text and "--wait-timeout" in text
    assert "``" not in text
