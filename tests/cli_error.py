"""What a CLI command shows a user, for tests that check it: the one-line message of a user
error, and the JSON object a command printed."""

import json

import pytest

from training.cli.main import main


def cli_error(argv: list[str]) -> str:
    """Run ``seqenc ARGV``, expect a user error (SystemExit with text, as main raises it) and
    return its message, checked to be one line without a traceback."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    message = str(exc.value.code)
    assert "\n" not in message and "Traceback" not in message
    return message


def printed_json(capsys) -> dict:
    """The JSON object a command printed first (what follows it, e.g. the task ``seqenc profile
    --write-task`` appended, is not read)."""
    out = capsys.readouterr().out
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]
