"""``python -m training.cli ...`` (e.g. under torchrun): the ``seqenc`` command."""

import sys

from training.cli.main import main

sys.exit(main())
