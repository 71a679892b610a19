"""The one-line message of a CLI user error, for tests that check what a user reads."""

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
