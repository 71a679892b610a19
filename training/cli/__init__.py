"""The ``seqenc`` command: argument parsing and one-line errors; the only importer of training.bench."""
